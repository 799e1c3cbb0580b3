# issue 24 item 3: a softmax of a matmul, then a max over the rows (7 operators)
program clip_softmax_max
input X [4, 8] float16
input W [8, 6] float16
Y = softmax(matmul(X, W), dim=1)
Z = max(Y, dim=0)
output Z
