fathom bench --offline --device cuda --load-format dummy --model tests/data/configs/deepseek-r1-distill-llama-8b.json --batch-size 1,64,256 --input-len 512 --output-len 128
