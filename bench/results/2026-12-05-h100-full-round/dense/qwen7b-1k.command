fathom bench --offline --device cuda --load-format dummy --model tests/data/configs/deepseek-r1-distill-qwen-7b.json --batch-size 64,256 --input-len 1024 --output-len 128
