//! The built-in configs (a part of `config.rs`): [`ModelConfig::flash`], DeepSeek-V4-Flash
//! exactly as released, and [`ModelConfig::tiny`], the toy-size architecture the tests and
//! `synth --preset tiny` use.

use super::*;

impl ModelConfig {
    /// The DeepSeek-V4-Flash config (docs/spec/model.md 1.1), exactly as released.
    pub fn flash() -> Self {
        let mut ratios = vec![0, 0];
        for _ in 0..20 {
            ratios.extend([4, 128]);
        }
        ratios.extend([4, 0]);
        ModelConfig {
            architectures: vec!["DeepseekV4ForCausalLM".into()],
            model_type: "deepseek_v4".into(),
            vocab_size: 129280,
            hidden_size: 4096,
            num_hidden_layers: 43,
            num_attention_heads: 64,
            num_key_value_heads: 1,
            head_dim: 512,
            qk_rope_head_dim: 64,
            q_lora_rank: 1024,
            o_groups: 8,
            o_lora_rank: 1024,
            index_n_heads: 64,
            index_head_dim: 128,
            index_topk: 512,
            n_routed_experts: 256,
            num_experts_per_tok: 6,
            n_shared_experts: 1,
            moe_intermediate_size: 2048,
            num_hash_layers: 3,
            num_nextn_predict_layers: 1,
            hc_mult: 4,
            hc_sinkhorn_iters: 20,
            hc_eps: 1e-6,
            rms_norm_eps: 1e-6,
            sliding_window: 128,
            rope_theta: 10000.0,
            compress_rope_theta: 160000.0,
            rope_scaling: Some(RopeScaling {
                kind: "yarn".into(),
                factor: 16.0,
                original_max_position_embeddings: 65536,
                beta_fast: 32.0,
                beta_slow: 1.0,
            }),
            routed_scaling_factor: 1.5,
            scoring_func: "sqrtsoftplus".into(),
            swiglu_limit: 10.0,
            norm_topk_prob: true,
            topk_method: Some("noaux_tc".into()),
            max_position_embeddings: 1048576,
            bos_token_id: 0,
            eos_token_id: 1,
            tie_word_embeddings: false,
            expert_dtype: Some("fp4".into()),
            quantization_config: Some(QuantizationConfig::official()),
            compress_ratios: ratios,
            hidden_act: "silu".into(),
            torch_dtype: Some("bfloat16".into()),
        }
    }

    /// The `tiny` synthetic architecture: every component at toy size (see docs/architecture.md section 7).
    /// Layers: 0 SWA (hash router), 1 CSA (hash router), 2 HCA, 3 CSA (score routers) + 1 MTP.
    /// Vocabulary 4096 (documented smaller than V4's 129,280 to keep the checkpoint at a few MB);
    /// 16 index heads so exact top-k ties are rare; top-k 8 so selection matters early.
    pub fn tiny() -> Self {
        let mut c = Self::flash();
        c.vocab_size = 4096;
        c.hidden_size = 64;
        c.num_hidden_layers = 4;
        c.compress_ratios = vec![0, 4, 128, 4, 0];
        c.num_nextn_predict_layers = 1;
        c.num_attention_heads = 4;
        c.head_dim = 64;
        c.qk_rope_head_dim = 16;
        c.q_lora_rank = 32;
        c.o_groups = 2;
        c.o_lora_rank = 32;
        c.index_n_heads = 16;
        c.index_head_dim = 32;
        c.index_topk = 8;
        c.n_routed_experts = 8;
        c.num_experts_per_tok = 2;
        c.moe_intermediate_size = 32;
        c.num_hash_layers = 2;
        c.expert_dtype = None;
        c.quantization_config = None;
        c
    }
}
