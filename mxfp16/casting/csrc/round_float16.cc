/*!
 * \file round_float16.cc
 * \brief MXNet 1.9 custom-operator library (lib_api.h, MX_LIBRARY_VERSION 11) registering
 *        `_mxfp16_round_float16`: y = float32(float16(x)) in one elementwise pass, the fused
 *        replacement of the pair Cast(float16) -> Cast(float32) that mxfp16's CPU emulation puts at
 *        every GEMM boundary.  Backward rounds the gradient the same way:
 *        dx = float32(float16(dy)).
 *
 * Numerics are bit for bit those of numpy's x.astype(float16).astype(float32) and of MXNet's Cast
 * pair: IEEE 754 binary16 with round to nearest even, |x| >= 65520 -> inf, subnormals kept down to
 * 2**-24, 2**-25 -> 0 (tie to even), -0 stays -0, NaN keeps its sign and top 10 payload bits.  F16C
 * (VCVTPS2PH / VCVTPH2PS) agrees except that it makes a signalling NaN quiet, so vectors holding a
 * NaN take the scalar path.
 *
 * The F16C path is compiled with a target attribute, not -mf16c, so that the library loads on any
 * x86-64 CPU and picks the bit-exact scalar path at run time where F16C is missing.  Setting the
 * environment variable MXFP16_FASTROUND_SCALAR=1 before the library loads forces the scalar path
 * (tests use it to check that path against numpy).
 *
 * Built by mxfp16/casting/fastround.py:
 *   c++ -O3 -std=c++14 -shared -fPIC -fopenmp -I<mxnet>/include \
 *       round_float16.cc <mxnet>/src/lib_api.cc -o lib_round_float16.so
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <unordered_map>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MXFP16_X86 1
#endif

#include "mxnet/lib_api.h"

using mxnet::ext::MXReturnValue;
using mxnet::ext::MXTensor;
using mxnet::ext::OpResource;
using mxnet::ext::MX_FAIL;
using mxnet::ext::MX_SUCCESS;

namespace {

// Below this many elements a parallel region costs more than it saves.
const int64_t kParallelThreshold = 1 << 16;
// Elements per parallel work item: 256 KiB of float32, a multiple of the 8-lane vector width.
const int64_t kChunk = 1 << 16;

uint32_t FloatBits(float value) {
  uint32_t bits;
  memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float BitsFloat(uint32_t bits) {
  float value;
  memcpy(&value, &bits, sizeof(value));
  return value;
}

// float32 bits -> binary16 bits, round to nearest even; integer-only, so MXCSR (FTZ/DAZ) and the
// compiler's floating-point flags cannot change the result.
uint16_t FloatToHalfBits(uint32_t f) {
  const uint32_t sign = (f >> 16) & 0x8000u;
  const uint32_t mag = f & 0x7fffffffu;
  if (mag >= 0x7f800000u) {  // inf, or NaN keeping its top payload bits (at least one set)
    if (mag == 0x7f800000u) return sign | 0x7c00u;
    const uint32_t payload = (mag >> 13) & 0x03ffu;
    return sign | 0x7c00u | (payload != 0 ? payload : 1u);
  }
  if (mag >= 0x477ff000u) return sign | 0x7c00u;  // 65520 and above overflow to inf
  if (mag >= 0x38800000u) {  // normal binary16: rebias the exponent, round away 13 bits
    const uint32_t rebiased = mag - 0x38000000u;
    return sign | ((rebiased + 0x0fffu + ((rebiased >> 13) & 1u)) >> 13);
  }
  if (mag < 0x33000000u) return sign;  // below 2**-25: rounds to zero
  // Subnormal binary16: the result counts units of 2**-24; a carry into bit 10 correctly yields
  // the smallest normal.
  const uint32_t shift = 126u - (mag >> 23);  // 14..24
  const uint32_t mantissa = (mag & 0x007fffffu) | 0x00800000u;
  const uint32_t units = mantissa >> shift;
  const uint32_t rest = mantissa & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1u);
  return sign | (units + (rest > halfway || (rest == halfway && (units & 1u))));
}

// binary16 bits -> float32 bits (exact).
uint32_t HalfToFloatBits(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x03ffu;
  if (exponent == 0x1fu) return sign | 0x7f800000u | (mantissa << 13);
  if (exponent != 0) return sign | ((exponent + 112u) << 23) | (mantissa << 13);
  if (mantissa == 0) return sign;
  const uint32_t shift = __builtin_clz(mantissa) - 21u;  // moves the leading one to bit 10
  return sign | ((113u - shift) << 23) | (((mantissa << shift) & 0x03ffu) << 13);
}

void RoundScalar(const float* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    out[i] = BitsFloat(HalfToFloatBits(FloatToHalfBits(FloatBits(in[i]))));
  }
}

#ifdef MXFP16_X86
__attribute__((target("avx,f16c")))
void RoundF16C(const float* in, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(in + i);
    if (_mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)) != 0) {
      RoundScalar(in + i, out + i, 8);  // F16C would make a signalling NaN quiet
      continue;
    }
    const __m128i half = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(half));
  }
  RoundScalar(in + i, out + i, n - i);
}
#endif

typedef void (*RoundKernel)(const float*, float*, int64_t);

RoundKernel ChooseKernel() {
  const char* force_scalar = getenv("MXFP16_FASTROUND_SCALAR");
  if (force_scalar != nullptr && strcmp(force_scalar, "") != 0 && strcmp(force_scalar, "0") != 0) {
    return RoundScalar;
  }
#ifdef MXFP16_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c")) return RoundF16C;
#endif
  return RoundScalar;
}

RoundKernel round_kernel = RoundScalar;  // set by initialize()

void RoundFloat16(const float* in, float* out, int64_t n) {
  if (n < kParallelThreshold) {
    round_kernel(in, out, n);
    return;
  }
  const int64_t num_chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (int64_t chunk = 0; chunk < num_chunks; ++chunk) {
    const int64_t begin = chunk * kChunk;
    const int64_t count = begin + kChunk <= n ? kChunk : n - begin;
    round_kernel(in + begin, out + begin, count);
  }
}

const char* DTypeName(int dtype) {
  switch (dtype) {
    case mxnet::ext::kFloat32: return "float32";
    case mxnet::ext::kFloat64: return "float64";
    case mxnet::ext::kFloat16: return "float16";
    case mxnet::ext::kUint8: return "uint8";
    case mxnet::ext::kInt32: return "int32";
    case mxnet::ext::kInt8: return "int8";
    case mxnet::ext::kInt64: return "int64";
    default: return "an unsupported dtype";
  }
}

// One float32 tensor in, one out, same shape; shared by forward (x -> y) and backward (dy -> dx).
MXReturnValue RoundTensor(const MXTensor& in, MXTensor* out) {
  if (in.dtype != mxnet::ext::kFloat32 || out->dtype != mxnet::ext::kFloat32) {
    MX_ERROR_MSG << "_mxfp16_round_float16 takes and returns float32, got input "
                 << DTypeName(in.dtype) << " and output " << DTypeName(out->dtype);
    return MX_FAIL;
  }
  RoundFloat16(static_cast<const float*>(in.data_ptr), out->data<float>(), in.size());
  return MX_SUCCESS;
}

MXReturnValue Forward(const std::unordered_map<std::string, std::string>& /*attrs*/,
                      std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                      const OpResource& /*res*/) {
  return RoundTensor(inputs->at(0), &outputs->at(0));
}

// Inputs are (dy, x, y), the layout lib_api gives every backward; only dy is read.
MXReturnValue Backward(const std::unordered_map<std::string, std::string>& /*attrs*/,
                       std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                       const OpResource& /*res*/) {
  return RoundTensor(inputs->at(0), &outputs->at(0));
}

MXReturnValue ParseAttrs(const std::unordered_map<std::string, std::string>& attrs,
                         int* num_in, int* num_out) {
  // MXNet passes its own "__...__" node attributes (ctx group, profiler scope) through here too.
  for (const auto& kv : attrs) {
    if (kv.first.compare(0, 2, "__") != 0) {
      MX_ERROR_MSG << "_mxfp16_round_float16 takes no parameters, got " << kv.first << "="
                   << kv.second << "; call it with the input tensor only";
      return MX_FAIL;
    }
  }
  *num_in = 1;
  *num_out = 1;
  return MX_SUCCESS;
}

MXReturnValue InferType(const std::unordered_map<std::string, std::string>& /*attrs*/,
                        std::vector<int>* in_types, std::vector<int>* out_types) {
  int& in_type = in_types->at(0);
  if (in_type == -1) in_type = mxnet::ext::kFloat32;  // unknown yet: float32 is the only choice
  if (in_type != mxnet::ext::kFloat32) {
    MX_ERROR_MSG << "_mxfp16_round_float16 accepts float32 input only, got " << DTypeName(in_type)
                 << "; cast the input to float32 first (a float16 tensor is already rounded)";
    return MX_FAIL;
  }
  out_types->at(0) = mxnet::ext::kFloat32;
  return MX_SUCCESS;
}

MXReturnValue InferShape(const std::unordered_map<std::string, std::string>& /*attrs*/,
                         std::vector<std::vector<unsigned int>>* in_shapes,
                         std::vector<std::vector<unsigned int>>* out_shapes) {
  out_shapes->at(0) = in_shapes->at(0);
  return MX_SUCCESS;
}

}  // namespace

REGISTER_OP(_mxfp16_round_float16)
.setParseAttrs(ParseAttrs)
.setInferType(InferType)
.setInferShape(InferShape)
.setForward(Forward, "cpu")
.setBackward(Backward, "cpu");

MXReturnValue initialize(int version) {
  // lib_api.h version 11 is the interface of MXNet 1.9 (version = major*10000 + minor*100 + patch).
  if (version < 10900 || version >= 20000) {
    MX_ERROR_MSG << "mxfp16's round_float16 library needs MXNet 1.9.x, got version " << version;
    return MX_FAIL;
  }
  round_kernel = ChooseKernel();
  return MX_SUCCESS;
}
