// Empty: the harness prelude (msl_tensor_ops.h) emulates the tensor ops the kernels use.
