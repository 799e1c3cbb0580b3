# a softmax of a matmul alone (6 operators)
program softmax_matmul
input X [4, 8] float16
input W [8, 6] float16
Y = softmax(matmul(X, W), dim=1)
output Y
