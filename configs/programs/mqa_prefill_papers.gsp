# Multi-query attention (MQA), chunked prefill (512 query tokens).
# Source: Mirage (paper 000) Table 4 / §7.2: MQA of Falcon-7B, 4096 key/value tokens, modes IncDec / SpecDec /
# PreFill = 1 / 32 / 512 query tokens. Falcon-7B: 71 query heads sharing 1 key/value head, head dim 64.
#
# The papers' form, kept unchanged so that comparisons with Mirage's published search times can still be
# made; mqa_prefill.gsp is the same attention in the stable form (max-subtracting softmax, K as models keep it).
#
# The single key/value head is replicated (repeat) to all query heads, as the GQA program does with its groups
# (MQA is GQA with one group). O = softmax(Q Kᵀ / sqrt(d)) V, softmax written as exp / sum / div.
# Layout: Q [b*h, s, d]; K is given PRE-TRANSPOSED as [b, d, n] (as Mirage's program takes it); V [b, n, d].
program mqa_prefill_papers
param b = 1       # sequences in the batch
param h = 71      # query heads
param s = 512      # query tokens
param n = 4096    # key/value tokens
param d = 64      # head dim
input Q [b*h, s, d] float16
input K [b, d, n] float16
input V [b, n, d] float16
Kr = repeat(K, dim=0, times=h)        # [b*h, d, n]
Vr = repeat(V, dim=0, times=h)        # [b*h, n, d]
A = scale(matmul(Q, Kr), 1/sqrt(d))   # [b*h, s, n]
E = exp(A)
S = sum(E, dim=2)
P = div(E, S)
O = matmul(P, Vr)                     # [b*h, s, d]
output O
