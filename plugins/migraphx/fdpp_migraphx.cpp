// MIGraphX custom ops for fdpp::AsyncSoftmaxAttention and fdpp::FlatGemm on the portable kernels (fdpp_migraphx.h).
// Host code only: shapes are checked in compute_shape (MIGraphX reports the exception's message at compile time),
// the launch reads pointers and strides off the arguments and runs on the context's stream.
#include "migraphx/fdpp_migraphx.h"

#include <migraphx/migraphx.hpp>

#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "capi/capi_errors.h"
#include "kernels/attention/attention_params.h"
#include "kernels/portable/portable.h"

namespace fdpp {
namespace mgx {
namespace {

[[noreturn]] void fail(const std::string& op, const std::string& why) { throw std::runtime_error(op + ": " + why); }

std::string dims(const std::vector<size_t>& lengths) {
  std::string s = "[";
  for (size_t i = 0; i < lengths.size(); ++i) s += (i ? ", " : "") + std::to_string(lengths[i]);
  return s + "]";
}

bool float_type(migraphx_shape_datatype_t t) {
  return t == migraphx_shape_half_type || t == migraphx_shape_bf16_type || t == migraphx_shape_float_type;
}

AttnDtype attn_dtype(migraphx_shape_datatype_t t) {
  if (t == migraphx_shape_half_type) return AttnDtype::kFloat16;
  return t == migraphx_shape_bf16_type ? AttnDtype::kBFloat16 : AttnDtype::kFloat32;
}

void check_launch(const std::string& op, port::Error err) {
  if (err != port::kSuccess) fail(op, std::string("kernel launch failed: ") + port::error_string(err));
}

struct AttentionAttrs {
  float scale, phi, guard_lo, guard_hi;
  int softmax;
  bool operator<(const AttentionAttrs& o) const {
    return std::tie(scale, phi, guard_lo, guard_hi, softmax) <
           std::tie(o.scale, o.phi, o.guard_lo, o.guard_hi, o.softmax);
  }
};

class AsyncSoftmaxAttentionOp final : public migraphx::experimental_custom_op_base {
 public:
  AsyncSoftmaxAttentionOp(std::string name, AttentionAttrs attrs) : name_(std::move(name)), attrs_(attrs) {}

  std::string name() const override { return name_; }
  bool runs_on_offload_target() const override { return true; }

  migraphx::shape compute_shape(migraphx::shapes inputs) const override {
    if (inputs.size() != 6)
      fail(name_,
           "takes query, key, value, past_len, a workspace allocation and the output allocation (6 inputs), got " +
               std::to_string(inputs.size()));
    const auto q = inputs[0].lengths(), k = inputs[1].lengths(), v = inputs[2].lengths();
    if (q.size() != 4 || k.size() != 4 || k != v || k[0] != q[0] || k[3] != q[3])
      fail(name_, "query " + dims(q) + ", key " + dims(k) + " and value " + dims(v) +
                      " must be [B, Hq, S, D] and [B, Hkv, L, D] with one B and D");
    if (!float_type(inputs[0].type()) || inputs[1].type() != inputs[0].type() || inputs[2].type() != inputs[0].type())
      fail(name_, "query, key and value must share one type: half, bf16 or float");
    if (inputs[3].type() != migraphx_shape_int64_type || inputs[3].lengths() != std::vector<size_t>{q[0]})
      fail(name_, "past_len must be int64 [" + std::to_string(q[0]) + "]");
    if (inputs[5].lengths() != q || inputs[5].type() != inputs[0].type())
      fail(name_, "the output allocation must have the query's shape " + dims(q) + " and type");
    return inputs.back();
  }

  migraphx::argument compute(migraphx::context ctx, migraphx::shape, migraphx::arguments inputs) const override {
    AttentionParams p = params(inputs);
    if (ParamsCheck c = check_attention_params(p, /*with_tensors=*/true)) fail(name_, c.message);
    const size_t have = inputs[4].get_shape().bytes();
    size_t need = 0;
    check_launch(name_, portable::attention_workspace_bytes(p, &need));
    if (need > have) p.num_splits = 1;  // the workspace given holds no split partials: one split needs none
    check_launch(name_, portable::attention_decode(p, inputs[4].data(), have, ctx.get_queue<hipStream_t>()));
    return inputs[5];
  }

 private:
  AttentionParams params(const migraphx::arguments& in) const {
    const auto q = in[0].get_shape(), k = in[1].get_shape(), v = in[2].get_shape(), o = in[5].get_shape();
    const auto ql = q.lengths(), kl = k.lengths();
    AttentionParams p;
    p.dtype = attn_dtype(q.type());
    p.batch = int(ql[0]), p.num_heads = int(ql[1]), p.seq = int(ql[2]), p.head_dim = int(ql[3]);
    p.num_kv_heads = int(kl[1]), p.kv_capacity = int(kl[2]), p.max_kv_len = int(kl[2]);
    p.mask_mode = MaskMode::kPastLen;
    p.softmax = static_cast<SoftmaxMode>(attrs_.softmax);
    p.scale = attrs_.scale, p.phi = attrs_.phi, p.guard_lo = attrs_.guard_lo, p.guard_hi = attrs_.guard_hi;
    const auto strides = [&](const migraphx::shape& s, int64_t* sb, int64_t* sh, int64_t* ss) {
      const auto st = s.strides();
      if (st[3] != 1) fail(name_, "the last dimension of query, key, value and output must be contiguous");
      *sb = int64_t(st[0]), *sh = int64_t(st[1]), *ss = int64_t(st[2]);
    };
    p.q = in[0].data(), p.k = in[1].data(), p.v = in[2].data(), p.out = in[5].data();
    strides(q, &p.q_sb, &p.q_sh, &p.q_ss);
    strides(k, &p.k_sb, &p.k_sh, &p.k_ss);
    strides(v, &p.v_sb, &p.v_sh, &p.v_ss);
    strides(o, &p.o_sb, &p.o_sh, &p.o_ss);
    p.past_len = reinterpret_cast<const int64_t*>(in[3].data());
    return p;
  }

  std::string name_;
  AttentionAttrs attrs_;
};

struct GemmAttrs {
  int epilogue, has_bias, has_residual;
  bool operator<(const GemmAttrs& o) const {
    return std::tie(epilogue, has_bias, has_residual) < std::tie(o.epilogue, o.has_bias, o.has_residual);
  }
};

class FlatGemmOp final : public migraphx::experimental_custom_op_base {
 public:
  FlatGemmOp(std::string name, GemmAttrs attrs) : name_(std::move(name)), attrs_(attrs) {}

  std::string name() const override { return name_; }
  bool runs_on_offload_target() const override { return true; }

  migraphx::shape compute_shape(migraphx::shapes inputs) const override {
    const size_t expected = 3 + attrs_.has_bias + attrs_.has_residual;
    if (inputs.size() != expected)
      fail(name_, "takes x, w" + std::string(attrs_.has_bias ? ", bias" : "") +
                      (attrs_.has_residual ? ", residual" : "") + " and the output allocation (" +
                      std::to_string(expected) + " inputs), got " + std::to_string(inputs.size()));
    const auto x = inputs[0].lengths(), w = inputs[1].lengths();
    if (x.empty() || w.size() != 2 || x.back() != w[1])
      fail(name_, "x " + dims(x) + " must be [..., K] and w " + dims(w) + " [N, K]");
    const auto type = inputs[0].type();
    if ((type != migraphx_shape_half_type && type != migraphx_shape_bf16_type) || inputs[1].type() != type)
      fail(name_, "x and w must both be half or both bf16");
    for (size_t i = 0; i < inputs.size(); ++i)
      if (!inputs[i].standard()) fail(name_, "input " + std::to_string(i) + " must be contiguous (standard shape)");
    std::vector<size_t> out = x;
    out.back() = attrs_.epilogue == 1 ? w[0] / 2 : w[0];
    if (inputs.back().lengths() != out || inputs.back().type() != type)
      fail(name_, "the output allocation must be " + dims(out) + " of x's type");
    if (attrs_.has_bias && inputs[2].lengths() != std::vector<size_t>{w[0]})
      fail(name_, "bias must be [" + std::to_string(w[0]) + "]");
    if (attrs_.has_residual && inputs[2 + attrs_.has_bias].lengths() != out)
      fail(name_, "residual must have the output's shape " + dims(out));
    return inputs.back();
  }

  migraphx::argument compute(migraphx::context ctx, migraphx::shape, migraphx::arguments inputs) const override {
    const auto x = inputs[0].get_shape(), w = inputs[1].get_shape();
    gemm::Problem p;
    p.k = int64_t(w.lengths()[1]);
    p.n = int64_t(w.lengths()[0]);
    p.m = int64_t(x.elements()) / p.k;
    p.dtype = x.type() == migraphx_shape_bf16_type ? gemm::Dtype::kBFloat16 : gemm::Dtype::kFloat16;
    p.epilogue = attrs_.epilogue == 1 ? gemm::Epilogue::kSiluMul : gemm::Epilogue::kNone;
    p.x = inputs[0].data(), p.w = inputs[1].data();
    p.bias = attrs_.has_bias ? inputs[2].data() : nullptr;
    p.residual = attrs_.has_residual ? inputs[2 + attrs_.has_bias].data() : nullptr;
    p.y = inputs[inputs.size() - 1].data();
    if (const char* why = portable::gemm_problem(p)) fail(name_, why);
    if (p.k % 8 != 0) fail(name_, "K must be a multiple of 8 (the kernels load 16 bytes at a time)");
    check_launch(name_, portable::gemm(p, ctx.get_queue<hipStream_t>()));
    return inputs[inputs.size() - 1];
  }

 private:
  std::string name_;
  GemmAttrs attrs_;
};

// One registration per attribute set; the name encodes the order of registration.
std::mutex g_mutex;
std::map<AttentionAttrs, std::string> g_attention;
std::map<GemmAttrs, std::string> g_gemm;

fdpp_status write_name(const std::string& name, char* out, size_t capacity, const char* fn) {
  if (out == nullptr || capacity <= name.size())
    return set_error(FDPP_ERR_INVALID_ARGUMENT,
                     std::string(fn) + ": name_out needs room for " + std::to_string(name.size() + 1) + " bytes");
  std::memcpy(out, name.c_str(), name.size() + 1);
  return FDPP_OK;
}

}  // namespace
}  // namespace mgx
}  // namespace fdpp

extern "C" {

fdpp_status fdpp_migraphx_register_attention(float scale, float phi, float guard_lo, float guard_hi,
                                             int32_t softmax_mode, char* name_out, size_t name_capacity) {
  return fdpp::guarded("fdpp_migraphx_register_attention", [&] {
    const char* fn = "fdpp_migraphx_register_attention";
    namespace c = fdpp::contract;
    if (!(std::isfinite(scale) && scale > 0.f) || !(phi >= c::kAttentionPhiMin && phi <= c::kAttentionPhiMax) ||
        !(guard_lo >= c::kAttentionGuardLoMin && guard_lo <= c::kAttentionGuardLoMax) ||
        !(guard_hi >= c::kAttentionGuardHiMin && guard_hi <= c::kAttentionGuardHiMax) || guard_lo >= guard_hi)
      return fdpp::set_error(FDPP_ERR_INVALID_ARGUMENT,
                             std::string(fn) +
                                 ": scale, phi, guard_lo and guard_hi must be in the "
                                 "contract's ranges (AsyncSoftmaxAttentionPlugin/contract.json)");
    if (softmax_mode != 0 && softmax_mode != 1)
      return fdpp::set_error(FDPP_ERR_INVALID_ARGUMENT, std::string(fn) + ": softmax_mode must be 0 or 1");
    const fdpp::mgx::AttentionAttrs attrs{scale, phi, guard_lo, guard_hi, softmax_mode};
    std::lock_guard<std::mutex> lock(fdpp::mgx::g_mutex);
    auto it = fdpp::mgx::g_attention.find(attrs);
    if (it == fdpp::mgx::g_attention.end()) {
      const std::string name =
          "fdpp::" + std::string(c::kAttentionOp) + "." + std::to_string(fdpp::mgx::g_attention.size() + 1);
      fdpp::mgx::AsyncSoftmaxAttentionOp op(name, attrs);
      migraphx::register_experimental_custom_op(op);
      it = fdpp::mgx::g_attention.emplace(attrs, name).first;
    }
    return fdpp::mgx::write_name(it->second, name_out, name_capacity, fn);
  });
}

fdpp_status fdpp_migraphx_register_flat_gemm(int32_t epilogue, int32_t has_bias, int32_t has_residual, char* name_out,
                                             size_t name_capacity) {
  return fdpp::guarded("fdpp_migraphx_register_flat_gemm", [&] {
    const char* fn = "fdpp_migraphx_register_flat_gemm";
    if ((epilogue != 0 && epilogue != 1) || (has_bias != 0 && has_bias != 1) ||
        (has_residual != 0 && has_residual != 1))
      return fdpp::set_error(FDPP_ERR_INVALID_ARGUMENT,
                             std::string(fn) + ": epilogue (0 none, 1 silu_mul), has_bias and has_residual are 0 or 1");
    const fdpp::mgx::GemmAttrs attrs{epilogue, has_bias, has_residual};
    std::lock_guard<std::mutex> lock(fdpp::mgx::g_mutex);
    auto it = fdpp::mgx::g_gemm.find(attrs);
    if (it == fdpp::mgx::g_gemm.end()) {
      const std::string name =
          "fdpp::" + std::string(fdpp::contract::kFlatGemmOp) + "." + std::to_string(fdpp::mgx::g_gemm.size() + 1);
      fdpp::mgx::FlatGemmOp op(name, attrs);
      migraphx::register_experimental_custom_op(op);
      it = fdpp::mgx::g_gemm.emplace(attrs, name).first;
    }
    return fdpp::mgx::write_name(it->second, name_out, name_capacity, fn);
  });
}

}  // extern "C"
