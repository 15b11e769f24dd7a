fathom bench --offline --device cuda --load-format dummy --model tests/data/configs/deepseek-v2-lite.json --max-model-len 4096 --batch-size 1,64,256 --input-len 512 --output-len 128
