fathom bench --offline --device cuda --load-format dummy --model tests/data/configs/deepseek-r1-distill-qwen-7b.json --max-model-len 4096 --batch-size 1 --input-len 512 --output-len 256
