// Every kernel the model code calls by name, for each backend this
// translation unit can build. The model's templates (parallel_linear.h,
// gpt_model.h) call a kernel unqualified and overloading on the activation
// type picks the CPU one (float) or the CUDA one (bf16); a template sees only
// the overloads declared before it, so both headers include this one first.
// CUDA overloads are declared where nvcc compiles (gpt_cuda.cu instantiates
// the CUDA model); elsewhere the CPU kernels are all there is.
#pragma once
#include "model/kernels/cpu_kernels.h"
#ifdef __CUDACC__
#include "model/kernels/cuda_kernels.h"
#ifdef TPSP_WITH_CUDNN
#include "model/kernels/cudnn_attention.h"
#endif
#endif
