// lm_training_reference: LmTrainingStep's oracle, the operators' references chained.

#include "numesh/ops/reference/lm_training.hpp"

#include <fmt/format.h>

#include <utility>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/reference/attention.hpp"
#include "numesh/ops/reference/backward.hpp"
#include "numesh/ops/reference/embedding.hpp"
#include "numesh/ops/reference/mlp.hpp"
#include "numesh/ops/reference/moe.hpp"
#include "numesh/ops/reference/norms.hpp"

namespace numesh::ops {

namespace {

using runtime::HostTensor;

RowMatrix as_rows(const HostTensor& t, std::int64_t rows, std::int64_t cols) {
  return ConstMatrixMap(t.data.data(), rows, cols);
}

HostTensor as_tensor(const RowMatrix& m, std::vector<std::int64_t> shape) {
  HostTensor t = HostTensor::zeros(std::move(shape));
  std::copy(m.data(), m.data() + m.size(), t.data.begin());
  return t;
}

HostTensor sum(const HostTensor& a, const HostTensor& b) {
  HostTensor s = a;
  for (std::size_t i = 0; i < s.data.size(); ++i) s.data[i] += b.data[i];
  return s;
}

// Refuses a negative aux loss coefficient, inputs or targets not one per token, and a block
// count other than the layers'. Returns the vocabulary size (the embedding table's rows).
std::int64_t lm_reference_check_arguments(const TransformerConfig& c,
                                          const EmbeddingWeights& embedding,
                                          const TransformerWeights& stack,
                                          std::span<const std::int32_t> inputs,
                                          std::span<const std::int32_t> targets, std::int64_t batch,
                                          std::int64_t tokens, double router_aux_loss_coef) {
  c.validate();  // as the step does: among others, MoE experts of another kind than SwiGLU
  NUMESH_CHECK(router_aux_loss_coef >= 0.0, ValueError,
               "training reference: router_aux_loss_coef {} is negative", router_aux_loss_coef);
  const std::int64_t rows = batch * tokens, vocab = embedding.table.shape.at(0);
  NUMESH_CHECK(static_cast<std::int64_t>(inputs.size()) == rows &&
                   static_cast<std::int64_t>(targets.size()) == rows,
               ShapeError, "training reference: {} inputs and {} targets for {} x {} tokens",
               inputs.size(), targets.size(), batch, tokens);
  NUMESH_CHECK(static_cast<std::int64_t>(stack.blocks.size()) == c.layers, ShapeError,
               "training reference: {} blocks of weights for {} layers", stack.blocks.size(),
               c.layers);
  return vocab;
}

// The activations' two shapes: the rows [B x T, H] and [B, T, H] (attention's).
struct LmReferenceShapes {
  const TransformerConfig& c;
  std::int64_t rows, h;
  std::vector<std::int64_t> flat, shaped;

  // The weight a block or final RMSNorm scales by: w + norm_weight_offset (fp32, as the
  // kernels sum it). Its gradient is w's: the offset is a constant.
  HostTensor norm_weight(const HostTensor& w) const {
    HostTensor scaled = w;
    for (float& v : scaled.data) v += c.norm_weight_offset;
    return scaled;
  }
  // RMSNorm of x's rows with weight w (plus the offset).
  HostTensor norm(const HostTensor& x, const HostTensor& w) const {
    return as_tensor(
        rmsnorm_reference(as_rows(x, rows, h), as_rows(norm_weight(w), 1, h), c.norm_eps), flat);
  }
};

// What a block's forward keeps for its backward.
struct LmReferenceKept {
  HostTensor block_in, n1, mid, n2;
};

// The blocks' forward from `stream` (the embedded tokens [rows, H]), which becomes the last
// block's output. Returns what each block kept.
std::vector<LmReferenceKept> lm_reference_blocks_forward(const LmReferenceShapes& st,
                                                         const TransformerWeights& stack,
                                                         HostTensor& stream) {
  const TransformerConfig& c = st.c;
  std::vector<LmReferenceKept> kept(static_cast<std::size_t>(c.layers));
  for (std::int64_t l = 0; l < c.layers; ++l) {
    const BlockWeights& b = stack.blocks[static_cast<std::size_t>(l)];
    LmReferenceKept& k = kept[static_cast<std::size_t>(l)];
    k.block_in = stream;
    k.n1 = st.norm(stream, b.attn_norm);
    HostTensor n1 = k.n1;
    n1.shape = st.shaped;
    HostTensor a = attention_layer_reference(n1, b.attention, c.attention);
    a.shape = st.flat;
    k.mid = sum(stream, a);
    k.n2 = st.norm(k.mid, b.ffn_norm);
    const HostTensor f =
        c.is_moe(l)
            ? as_tensor(moe_reference(as_rows(k.n2, st.rows, st.h), b.moe, c.moe), st.flat)
            : as_tensor(mlp_reference(as_rows(k.n2, st.rows, st.h), c.mlp_kind, b.mlp), st.flat);
    stream = sum(k.mid, f);
  }
  return kept;
}

// The router's load-balancing loss over every MoE layer's rows at once, added into out's loss.
// Returns its gradient of the probabilities, scaled by the coefficient (none without it).
std::vector<double> lm_reference_router_aux(const TransformerConfig& c,
                                            const TransformerWeights& stack,
                                            const std::vector<LmReferenceKept>& kept,
                                            double router_aux_loss_coef, LmTrainingGrads& out) {
  std::vector<double> aux_dprobs;
  if (router_aux_loss_coef > 0.0) {
    std::vector<HostTensor> moe_inputs, routers;
    for (std::int64_t l = 0; l < c.layers; ++l) {
      if (!c.is_moe(l)) continue;
      moe_inputs.push_back(kept[static_cast<std::size_t>(l)].n2);  // [rows, H]
      routers.push_back(stack.blocks[static_cast<std::size_t>(l)].moe.router);
    }
    if (!moe_inputs.empty()) {
      const RouterAuxLoss aux = router_aux_loss(moe_inputs, routers, c.moe);
      out.router_aux_loss = aux.loss;
      out.loss += router_aux_loss_coef * aux.loss;
      for (const double d : aux.dprobs) aux_dprobs.push_back(router_aux_loss_coef * d);
    }
  }
  return aux_dprobs;
}

// The feed-forward's backward (MoE or the config's MLP) given the block output's gradient; its
// parameters' gradients go to out.grads under `p`. Returns the gradient of its input [rows, H].
HostTensor lm_reference_ffn_backward(const LmReferenceShapes& st, const BlockWeights& b,
                                     const LmReferenceKept& k, std::int64_t l, const std::string& p,
                                     const HostTensor& d_stream,
                                     const std::vector<double>& aux_dprobs, LmTrainingGrads& out) {
  HostTensor dn2;
  if (st.c.is_moe(l)) {
    MoeGrads moe = moe_backward(k.n2, b.moe, st.c.moe, d_stream, aux_dprobs);
    out.grads[p + "moe.router"] = moe.drouter;
    out.grads[p + "moe.gate"] = moe.dgate;
    out.grads[p + "moe.up"] = moe.dup;
    out.grads[p + "moe.down"] = moe.ddown;
    if (b.moe.has_shared_expert()) {  // Qwen2-MoE
      out.grads[p + "moe.shared_expert.gate"] = moe.dshared_gate;
      out.grads[p + "moe.shared_expert.up"] = moe.dshared_up;
      out.grads[p + "moe.shared_expert.down"] = moe.dshared_down;
      out.grads[p + "moe.shared_expert_gate"] = moe.dshared_expert_gate;
    }
    dn2 = std::move(moe.dx);
  } else {
    MlpGrads mlp = mlp_backward(k.n2, st.c.mlp_kind, b.mlp, d_stream);
    // Llama's mlp_bias, where the model has it, as rows [1, n] (the step's layout).
    for (auto& [slot, grad] :
         {std::pair{"gate_bias", &mlp.dgate_bias}, std::pair{"up_bias", &mlp.dup_bias},
          std::pair{"down_bias", &mlp.ddown_bias}}) {
      if (grad->shape.empty()) continue;
      grad->shape = {1, static_cast<std::int64_t>(grad->data.size())};
      out.grads[p + "mlp." + slot] = *grad;
    }
    if (!mlp.dgate.shape.empty()) out.grads[p + "mlp.gate"] = mlp.dgate;  // GELU: no gate
    out.grads[p + "mlp.up"] = mlp.dup;
    out.grads[p + "mlp.down"] = mlp.ddown;
    dn2 = std::move(mlp.dx);
  }
  dn2.shape = st.flat;
  return dn2;
}

// Block l's backward given its output's gradient: the feed-forward, its norm, attention, its
// norm; the parameters' gradients go to out.grads. Returns the gradient of the block's input.
HostTensor lm_reference_block_backward(const LmReferenceShapes& st, const BlockWeights& b,
                                       const LmReferenceKept& k, std::int64_t l,
                                       const HostTensor& d_stream,
                                       const std::vector<double>& aux_dprobs,
                                       LmTrainingGrads& out) {
  const TransformerConfig& c = st.c;
  const std::string p = fmt::format("layers.{}.", l);
  const HostTensor dn2 = lm_reference_ffn_backward(st, b, k, l, p, d_stream, aux_dprobs, out);
  const RmsNormGrads ffn_norm =
      rmsnorm_backward(k.mid, st.norm_weight(b.ffn_norm), dn2, c.norm_eps);
  out.grads[p + "ffn_norm"] = ffn_norm.dweight;
  HostTensor dmid = sum(ffn_norm.dx, d_stream);
  HostTensor n1 = k.n1;
  n1.shape = st.shaped;
  dmid.shape = st.shaped;
  AttentionGrads attention = attention_layer_backward(n1, b.attention, c.attention, dmid);
  dmid.shape = st.flat;
  attention.dx.shape = st.flat;
  out.grads[p + "attention.wq"] = attention.dwq;
  out.grads[p + "attention.wk"] = attention.dwk;
  out.grads[p + "attention.wv"] = attention.dwv;
  out.grads[p + "attention.wo"] = attention.dwo;
  // Biases and q/k norms, where the model has them, as rows [1, n] (the step's layout).
  for (auto& [slot, grad] :
       {std::pair{"bq", &attention.dbq}, std::pair{"bk", &attention.dbk},
        std::pair{"bv", &attention.dbv}, std::pair{"bo", &attention.dbo},
        std::pair{"q_norm", &attention.dq_norm}, std::pair{"k_norm", &attention.dk_norm}}) {
    if (grad->shape.empty()) continue;
    grad->shape = {1, static_cast<std::int64_t>(grad->data.size())};
    out.grads[p + "attention." + slot] = *grad;
  }
  const RmsNormGrads attn_norm =
      rmsnorm_backward(k.block_in, st.norm_weight(b.attn_norm), attention.dx, c.norm_eps);
  out.grads[p + "attn_norm"] = attn_norm.dweight;
  return sum(attn_norm.dx, dmid);
}

}  // namespace

LmTrainingGrads lm_training_reference(const TransformerConfig& c, const EmbeddingWeights& embedding,
                                      const TransformerWeights& stack, const LmHeadWeights* head,
                                      std::span<const std::int32_t> inputs,
                                      std::span<const std::int32_t> targets, std::int64_t batch,
                                      std::int64_t tokens, double router_aux_loss_coef) {
  const std::int64_t vocab = lm_reference_check_arguments(c, embedding, stack, inputs, targets,
                                                          batch, tokens, router_aux_loss_coef);
  const std::int64_t rows = batch * tokens, h = c.hidden;
  const LmReferenceShapes st{
      .c = c, .rows = rows, .h = h, .flat = {rows, h}, .shaped = {batch, tokens, h}};
  HostTensor stream = embedding_reference(inputs, embedding);  // [rows, H]
  const std::vector<LmReferenceKept> kept = lm_reference_blocks_forward(st, stack, stream);
  const HostTensor y = st.norm(stream, stack.final_norm);
  const HostTensor head_w = head != nullptr ? head->weight : transposed(embedding.table);
  const CrossEntropyGrads ce = lm_head_cross_entropy(y, head_w, targets);

  LmTrainingGrads out;
  out.loss = ce.loss;
  const std::vector<double> aux_dprobs =
      lm_reference_router_aux(c, stack, kept, router_aux_loss_coef, out);
  const RmsNormGrads final_grads =
      rmsnorm_backward(stream, st.norm_weight(stack.final_norm), ce.dx, c.norm_eps);
  out.grads["final_norm"] = final_grads.dweight;
  HostTensor d_stream = final_grads.dx;
  for (std::int64_t l = c.layers; l-- > 0;) {
    d_stream = lm_reference_block_backward(st, stack.blocks[static_cast<std::size_t>(l)],
                                           kept[static_cast<std::size_t>(l)], l, d_stream,
                                           aux_dprobs, out);
  }
  // The lookup's scale (Gemma's sqrt(H)) scales its gradient too.
  for (float& v : d_stream.data) v *= embedding.output_scale;
  HostTensor table = embedding_backward(inputs, vocab, d_stream);
  if (head != nullptr) {
    out.grads["lm_head.weight"] = ce.dw;
  } else {
    table = sum(table, transposed(ce.dw));
  }
  out.grads["embedding.table"] = std::move(table);
  return out;
}

}  // namespace numesh::ops
