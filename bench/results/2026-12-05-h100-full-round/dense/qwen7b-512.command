fathom bench --offline --device cuda --load-format dummy --model tests/data/configs/deepseek-r1-distill-qwen-7b.json --batch-size 1 --input-len 512 --output-len 128
