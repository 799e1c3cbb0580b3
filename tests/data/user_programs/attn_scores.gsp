# attention scores with a scale and a softmax over [2, 6, 10] (8 operators)
program attn_scores
input Q [2, 6, 4] float16
input K [2, 10, 4] float16
S = scale(matmul(Q, transpose(K, 1, 2)), 0.5)
P = softmax(S, dim=2)
output P
