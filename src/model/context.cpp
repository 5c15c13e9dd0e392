#include "model/context.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "core/check.h"
#include "core/log.h"
#include "kernels/activations.h"
#include "kernels/kernels.h"
#include "kernels/ops.h"

namespace td {

Result<std::unique_ptr<Context>> Context::create(std::shared_ptr<const Model> model,
                                                 const ContextParams &params, ThreadPool &pool,
                                                 Collective *collective) {
    const HParams &hp = model->hparams();
    int32_t n_ctx = params.n_ctx > 0 ? params.n_ctx : hp.n_ctx_train;
    if (n_ctx <= 0 || n_ctx > (1 << 20)) return invalid_input("context size {} must be in 1..1048576", n_ctx);
    if (params.n_seq <= 0 || params.n_seq > 4096)
        return invalid_input("number of sequences {} must be in 1..4096", params.n_seq);
    if (n_ctx > hp.n_ctx_train)
        log_warn("context size {} exceeds the model's training context {}; quality may suffer", n_ctx,
                 hp.n_ctx_train);

    if (model->is_slice() && collective == nullptr)
        return invalid_input("{}: a tensor-parallel slice ({}) needs its group's collective", model->file().path(),
                             tp_slice_str(model->slice()));
    for (const auto &[t, which] : {std::pair{params.type_k, "K"}, std::pair{params.type_v, "V"}}) {
        if (static_cast<uint32_t>(t) >= kKvTypeCount)
            return invalid_input("unknown {} cache type {}", which, static_cast<uint32_t>(t));
        const int64_t block = dtype_traits(kv_dtype(t)).block_size;
        if (hp.head_dim % block != 0)
            return invalid_input("a {} {} cache needs a head size that is a multiple of {}; {} has {}",
                                 kv_type_name(t), which, block, model->file().path(), hp.head_dim);
    }
    std::unique_ptr<Context> ctx(new Context());
    if (model->is_slice()) ctx->collective_ = collective;
    ctx->model_ = std::move(model);
    ctx->pool_ = &pool;
    ctx->n_ctx_ = n_ctx;
    const int32_t n_layer = ctx->model_->layer_last() - ctx->model_->layer_first();
    TD_ASSIGN_OR_RETURN(
        ctx->kv_, KvCache::create(std::max(n_layer, 1), params.n_seq, n_ctx, ctx->model_->n_embd_kv_local(),
                                  params.type_k, params.type_v));
    kernels::RopeParams &r = ctx->rope_;
    r.n_rot = hp.n_rot;
    r.freq_base = hp.rope_freq_base;
    r.freq_scale = hp.rope_scaling == RopeScaling::linear ? 1.0f / hp.rope_scale_factor : 1.0f;
    r.freq_factors = ctx->model_->rope_freq_factors();
    r.order = hp.rope_order;
    return ctx;
}

Status Context::validate(const Batch &batch, const float *hidden_in) const {
    const Model &m = *model_;
    const int32_t n = batch.size();
    if (n == 0) return invalid_input("empty batch");
    if (batch.seq.size() != batch.pos.size() || batch.want_logits.size() != batch.pos.size() ||
        (!batch.target.empty() && batch.target.size() != batch.pos.size()) ||
        (m.layer_first() == 0 && batch.token.size() != batch.pos.size()))
        return invalid_input("batch arrays have different lengths");
    if (m.layer_first() > 0 && hidden_in == nullptr)
        return invalid_input("a stage starting at layer {} needs hidden-state input", m.layer_first());
    // Positions of each sequence must continue its cache without gaps (a sequence may also rewind).
    std::vector<int32_t> next(kv_.n_seq(), -1);  // TODO(perf): small allocation per batch
    for (int32_t i = 0; i < n; ++i) {
        const int32_t s = batch.seq[i], p = batch.pos[i];
        if (s < 0 || s >= kv_.n_seq())
            return invalid_input("sequence {} is out of range (this context has {} slots)", s, kv_.n_seq());
        if (p < 0 || p >= n_ctx_)
            return invalid_input(
                "position {} is beyond the context size {} (prompt plus generated tokens must fit)", p,
                n_ctx_);
        const int32_t expected = next[s] < 0 ? kv_.seq_len(s) : next[s];
        if (next[s] < 0 ? p > expected : p != expected)
            return invalid_input("sequence {}: position {} does not follow position {}", s, p, expected - 1);
        next[s] = p + 1;
        if (batch.want_logits[i] > kOutLast)
            return invalid_input(
                "row {}: output kind {} is unknown (0 none, 1 logits, 2 embedding, 3 draft, 4 score)", i,
                batch.want_logits[i]);
        if (batch.want_logits[i] == kOutDraft &&
            (i == 0 || batch.seq[i - 1] != s || !out_is_sampled(batch.want_logits[i - 1])))
            return invalid_input("row {}: a draft row must follow a row of its sequence that is sampled", i);
        if (batch.want_logits[i] == kOutScore) {
            const int32_t t = batch.target.size() == batch.pos.size() ? batch.target[i] : -1;
            if (t < 0 || t >= m.hparams().n_vocab)
                return invalid_input("row {}: a score row's target token {} is outside the vocabulary of {}",
                                     i, t, m.hparams().n_vocab);
        }
        if (m.layer_first() == 0) {
            const int32_t t = batch.token[i];
            if (t < 0 || t >= m.hparams().n_vocab)
                return invalid_input("token id {} is out of range (vocabulary has {} tokens)", t,
                                     m.hparams().n_vocab);
        }
    }
    return {};
}

void Context::ensure_scratch(int32_t n) {
    const HParams &hp = model_->hparams();
    const size_t rows = static_cast<size_t>(n);
    auto grow = [](std::vector<float> &v, size_t size) {
        if (v.size() < size) v.resize(size);
    };
    grow(x_, rows * hp.n_embd);
    // Everything else holds one micro-batch of at most kMaxUbatch rows (layer_forward).
    const size_t ub = std::min<size_t>(rows, kMaxUbatch);
    grow(xn_, ub * hp.n_embd);
    const Model &m = *model_;
    grow(q_, ub * m.n_embd_q_local());
    grow(k_, ub * m.n_embd_kv_local());
    grow(v_, ub * m.n_embd_kv_local());
    grow(attn_, ub * m.n_embd_q_local());
    grow(gate_, ub * m.n_ff_local());
    grow(up_, ub * m.n_ff_local());
    grow(scores_, static_cast<size_t>(pool_->n_threads()) * 2 * kAttnBlock * n_ctx_);
}

Status Context::decode(const Batch &batch, const float *hidden_in) {
    TD_TRY(validate(batch, hidden_in));
    const Model &m = *model_;
    const HParams &hp = m.hparams();
    const int32_t n = batch.size();
    const int64_t n_embd = hp.n_embd;
    ensure_scratch(n);

    // Input: embedding rows (dequantized from the table's type) or the previous stage's hidden state.
    if (m.layer_first() == 0) {
        const TensorView &emb = m.tok_embd();
        const kernels::TypeKernels *k = kernels::type_kernels(emb.type);
        // Gemma scales the embeddings by sqrt(n_embd) (an f32 constant, as llama.cpp rounds it).
        const float embd_scale = m.arch().scale_embd ? std::sqrt(static_cast<float>(n_embd)) : 1.0f;
        pool_->parallel_for(n, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) {
                float *row = &x_[i * n_embd];  // [n_embd]
                k->to_float(emb.row(batch.token[i]), row, n_embd);
                if (embd_scale != 1.0f)
                    for (int64_t j = 0; j < n_embd; ++j) row[j] *= embd_scale;
            }
        });
    } else {
        std::memcpy(x_.data(), hidden_in, static_cast<size_t>(n) * n_embd * sizeof(float));
    }

    for (int32_t il = m.layer_first(); il < m.layer_last(); ++il) TD_TRY(layer_forward(il, batch));

    // The sequences now extend to the last position written.
    for (int32_t i = 0; i < n; ++i) kv_.seq_set_len(batch.seq[i], batch.pos[i] + 1);

    n_outputs_ = 0;
    n_embeddings_ = 0;
    if (m.layer_last() != hp.n_layer) return {};

    // Output head: final norm for the rows that want an output; the rows that want logits then go through
    // the [n_outputs, n_vocab] projection, the rows that want an embedding stay as they are.
    n_outputs_ = batch.n_outputs();
    n_embeddings_ = batch.n_embeddings();
    if (n_outputs_ + n_embeddings_ == 0) return {};
    if (out_rows_.size() < static_cast<size_t>(n_outputs_) * n_embd)
        out_rows_.resize(static_cast<size_t>(n_outputs_) * n_embd);
    if (embd_rows_.size() < static_cast<size_t>(n_embeddings_) * n_embd)
        embd_rows_.resize(static_cast<size_t>(n_embeddings_) * n_embd);
    const float *norm_w = static_cast<const float *>(m.output_norm().data);
    for (int32_t i = 0, o = 0, e = 0; i < n; ++i) {
        if (out_has_logits(batch.want_logits[i]))
            kernels::rmsnorm(&x_[i * n_embd], norm_w, &out_rows_[o++ * n_embd], n_embd, hp.rms_eps);
        else if (batch.want_logits[i] == kOutEmbedding)
            kernels::rmsnorm(&x_[i * n_embd], norm_w, &embd_rows_[e++ * n_embd], n_embd, hp.rms_eps);
    }
    if (n_outputs_ == 0) return {};
    const size_t n_logits = static_cast<size_t>(n_outputs_) * m.n_vocab_local();
    if (logits_.size() < n_logits) logits_.resize(n_logits);
    kernels::matmul(m.output(), out_rows_.data(), logits_.data(), n_outputs_, *pool_, mm_scratch_);
    if (hp.final_softcap > 0.0f) {
        // gemma2: logits = c * tanh(logits / c), as llama.cpp rounds it: multiply by the f32 1/c, libm's
        // tanhf, multiply by c.
        const float c = hp.final_softcap, inv_c = 1.0f / hp.final_softcap;
        pool_->parallel_for(
            static_cast<int64_t>(n_logits),
            [&](int64_t b, int64_t e) {
                for (int64_t i = b; i < e; ++i) logits_[i] = c * std::tanh(logits_[i] * inv_c);
            },
            4096);
    }
    return {};
}

Status Context::layer_forward(int32_t il, const Batch &batch) {
    const int32_t n = batch.size();
    for (int32_t r0 = 0; r0 < n; r0 += kMaxUbatch)
        TD_TRY(layer_forward_rows(il, batch, r0, std::min(kMaxUbatch, n - r0)));
    return {};
}

Status Context::reduce(int32_t n) {
    if (collective_ == nullptr) return {};
    return collective_->all_reduce_sum(xn_.data(), static_cast<size_t>(n) * model_->hparams().n_embd);
}

Status Context::layer_forward_rows(int32_t il, const Batch &batch, int32_t r0, int32_t n) {
    const Model &m = *model_;
    const HParams &hp = m.hparams();
    const LayerWeights &w = m.layer(il);
    float *x = &x_[static_cast<size_t>(r0) * hp.n_embd];  // [n, n_embd] these rows of the residual stream
    const int32_t *pos = &batch.pos[r0];                  // [n]
    const int32_t *seq = &batch.seq[r0];                  // [n]
    const int32_t local = il - m.layer_first();
    // This rank's heads and FFN rows (all of them on one machine).
    const int64_t n_embd = hp.n_embd, n_q = m.n_embd_q_local(), n_kv = m.n_embd_kv_local(), n_ff = m.n_ff_local();
    const int32_t head_dim = hp.head_dim, n_head = m.n_head_local(), n_head_kv = m.n_head_kv_local();
    ThreadPool &pool = *pool_;

    // --- attention block:  x += Wo · attn(rope(Wq·n(x)), rope(Wk·n(x)), Wv·n(x)) ---
    // (gemma2: the sum's term goes through post_attention_norm first, like the FFN's through post_ffw_norm)
    const float *attn_norm = static_cast<const float *>(w.attn_norm.data);
    pool.parallel_for(n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i)
            kernels::rmsnorm(&x[i * n_embd], attn_norm, &xn_[i * n_embd], n_embd, hp.rms_eps);
    });
    const kernels::MatmulOut qkv[] = {{&w.wq, q_.data()}, {&w.wk, k_.data()}, {&w.wv, v_.data()}};
    kernels::matmul_group(qkv, 3, xn_.data(), n, pool, mm_scratch_);

    const DType type_k = kv_dtype(kv_.type_k()), type_v = kv_dtype(kv_.type_v());
    pool.parallel_for(n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
            float *q = &q_[i * n_q], *k = &k_[i * n_kv], *v = &v_[i * n_kv];
            if (w.bq.data) {
                kernels::add_inplace(q, static_cast<const float *>(w.bq.data), n_q);
                kernels::add_inplace(k, static_cast<const float *>(w.bk.data), n_kv);
                kernels::add_inplace(v, static_cast<const float *>(w.bv.data), n_kv);
            }
            if (w.q_norm.data) {
                for (int32_t h = 0; h < n_head; ++h)
                    kernels::rmsnorm(q + h * head_dim, static_cast<const float *>(w.q_norm.data),
                                     q + h * head_dim, head_dim, hp.rms_eps);
                for (int32_t h = 0; h < n_head_kv; ++h)
                    kernels::rmsnorm(k + h * head_dim, static_cast<const float *>(w.k_norm.data),
                                     k + h * head_dim, head_dim, hp.rms_eps);
            }
            kernels::rope(q, n_head, head_dim, pos[i], rope_);
            kernels::rope(k, n_head_kv, head_dim, pos[i], rope_);
            if (hp.attn_q_scale > 0.0f)  // gemma2: the queries carry the attention scale
                for (int64_t j = 0; j < n_q; ++j) q[j] *= hp.attn_q_scale;
            kernels::store_row_typed(k, kv_.k_row(local, seq[i], pos[i]), type_k, n_kv);
            kernels::store_row_typed(v, kv_.v_row(local, seq[i], pos[i]), type_v, n_kv);
        }
    });

    // Each row attends over its own sequence's positions first..pos (causal; first > 0 only in a
    // sliding-window layer). A job is one row, one K/V head and a block of the query heads that share it
    // (grouped-query attention reads each K/V row once per block); blocks shrink when there are too few jobs
    // to keep every thread busy.
    const float scale = hp.attn_q_scale > 0.0f ? 1.0f : 1.0f / std::sqrt(static_cast<float>(head_dim));
    const int32_t n_gqa = hp.n_gqa();
    // The bytes of one head within a row (a block type's blocks never straddle heads: checked at create).
    const size_t k_head = dtype_row_bytes(type_k, head_dim), v_head = dtype_row_bytes(type_v, head_dim);
    const int32_t n_swa = hp.layer_is_swa(il) ? hp.n_swa : 0;
    int32_t block = std::min(n_gqa, kAttnBlock);
    while (block > 1 &&
           static_cast<int64_t>(n) * n_head_kv * ((n_gqa + block - 1) / block) < 2 * pool.n_threads())
        block = (block + 1) / 2;
    const int32_t n_blocks = (n_gqa + block - 1) / block;
    const int64_t n_jobs = static_cast<int64_t>(n) * n_head_kv * n_blocks;
    pool.run([&](int ith, int nth) {
        float *scores = &scores_[static_cast<size_t>(ith) * 2 * kAttnBlock * n_ctx_];
        for (int64_t job = ith; job < n_jobs; job += nth) {
            const int64_t i = job / (static_cast<int64_t>(n_head_kv) * n_blocks);
            const int32_t kvh = static_cast<int32_t>(job / n_blocks % n_head_kv);
            const int32_t h0 = kvh * n_gqa + static_cast<int32_t>(job % n_blocks) * block;
            const int32_t n_q_heads = std::min(block, (kvh + 1) * n_gqa - h0);
            const int32_t first = n_swa > 0 ? std::max(0, pos[i] - n_swa + 1) : 0;
            const kernels::KvRows k_rows{kv_.k_row(local, seq[i], first) + kvh * k_head, type_k,
                                         kv_.k_row_bytes()};
            const kernels::KvRows v_rows{kv_.v_row(local, seq[i], first) + kvh * v_head, type_v,
                                         kv_.v_row_bytes()};
            kernels::attention_group_typed(&q_[i * n_q + h0 * head_dim], n_q_heads, k_rows, v_rows, head_dim,
                                           pos[i] + 1 - first, scale, hp.attn_softcap, scores,
                                           &attn_[i * n_q + h0 * head_dim]);
        }
    });
    kernels::matmul(w.wo, attn_.data(), xn_.data(), n, pool, mm_scratch_);
    TD_TRY(reduce(n));  // a slice's Wo columns give a partial sum: all-reduce 1 of 2
    post_norm(w.attn_post_norm, n);
    kernels::add_inplace(x, xn_.data(), static_cast<int64_t>(n) * n_embd);

    // --- feed-forward block:  x += W_down · (silu(W_gate·n(x)) * W_up·n(x)) ---
    const float *ffn_norm = static_cast<const float *>(w.ffn_norm.data);
    pool.parallel_for(n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i)
            kernels::rmsnorm(&x[i * n_embd], ffn_norm, &xn_[i * n_embd], n_embd, hp.rms_eps);
    });
    const kernels::MatmulOut gate_up[] = {{&w.w_gate, gate_.data()}, {&w.w_up, up_.data()}};
    kernels::matmul_group(gate_up, 2, xn_.data(), n, pool, mm_scratch_);
    const bool gelu = m.arch().ffn_act == FfnAct::gelu;
    pool.parallel_for(n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
            float *g = &gate_[i * n_ff];  // [n_ff], becomes act(g) * up
            if (gelu) {
                kernels::geglu(g, &up_[i * n_ff], g, n_ff);
            } else {
                kernels::swiglu(g, &up_[i * n_ff], g, n_ff);
            }
        }
    });
    kernels::matmul(w.w_down, gate_.data(), xn_.data(), n, pool, mm_scratch_);
    TD_TRY(reduce(n));  // all-reduce 2 of 2
    post_norm(w.ffn_post_norm, n);
    kernels::add_inplace(x, xn_.data(), static_cast<int64_t>(n) * n_embd);
    return {};
}

void Context::post_norm(const TensorView &norm, int32_t n) {
    if (norm.data == nullptr) return;
    const HParams &hp = model_->hparams();
    const int64_t n_embd = hp.n_embd;
    const float *w = static_cast<const float *>(norm.data);  // [n_embd]
    pool_->parallel_for(n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i)
            kernels::rmsnorm(&xn_[i * n_embd], w, &xn_[i * n_embd], n_embd, hp.rms_eps);
    });
}

}  // namespace td
