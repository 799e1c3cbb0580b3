# RMSNorm (epsilon, weight) then a matmul at odd shapes (8 operators)
program rmsnorm_odd
input X [6, 20] float16
input G [20] float16
input W [20, 12] float16
Y = rms_norm(X, eps=1e-6) * G
O = matmul(Y, W)
output O
