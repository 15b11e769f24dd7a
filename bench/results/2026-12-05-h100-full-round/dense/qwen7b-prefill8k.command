fathom bench --offline --device cuda --load-format dummy --model tests/data/configs/deepseek-r1-distill-qwen-7b.json --batch-size 16 --input-len 512 --output-len 2 --max-num-batched-tokens 8192
