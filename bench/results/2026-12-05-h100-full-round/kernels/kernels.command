cuda_kernel_bench --ops 1 --filter PagedAttention
