# Multi-query attention (MQA), speculative decoding (32 query tokens).
# Source: Mirage (paper 000) Table 4 / §7.2: MQA of Falcon-7B, 4096 key/value tokens, modes IncDec / SpecDec /
# PreFill = 1 / 32 / 512 query tokens. Falcon-7B: 71 query heads sharing 1 key/value head, head dim 64.
#
# The single key/value head is replicated (repeat) to all query heads, as the GQA program does with its groups
# (MQA is GQA with one group). O = softmax(Q Kᵀ / sqrt(d)) V with the stable softmax (the row maximum
# subtracted before exp, as torch's F.scaled_dot_product_attention computes it), and K as models keep it,
# [heads, keys, dim], transposed in the program. Mirage's form (exp / sum / div without the maximum, K given
# pre-transposed) overflows on the large logits of real models (attention sinks), and stays available
# unchanged as mqa_specdec_papers.gsp for comparisons with Mirage's published search times.
# Layout: Q [b*h, s, d]; K and V [b, n, d].
program mqa_specdec
param b = 1       # sequences in the batch
param h = 71      # query heads
param s = 32      # query tokens
param n = 4096    # key/value tokens
param d = 64      # head dim
input Q [b*h, s, d] float16
input K [b, n, d] float16
input V [b, n, d] float16
Kr = repeat(K, dim=0, times=h)                         # [b*h, n, d]
Vr = repeat(V, dim=0, times=h)                         # [b*h, n, d]
A = scale(matmul(Q, transpose(Kr, 1, 2)), 1/sqrt(d))   # [b*h, s, n]
P = softmax(A, dim=2)                                  # exp(A - max A) / sum exp(A - max A)
O = matmul(P, Vr)                                      # [b*h, s, d]
output O
