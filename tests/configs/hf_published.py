"""Hugging Face `config.json` contents of the shipped hybrid and dense models, written from the published key
names (no download): the fields k3sim reads and a few it ignores, in each family's own spelling. Sources are
the ones named in each `models/*.yaml` header; `CONFIGS[name]` is the config of `models/<name>.yaml`."""

from __future__ import annotations

QWEN3_NEXT = {  # Qwen/Qwen3-Next-80B-A3B-*: config.json as quoted in ai-dynamo/aiconfigurator model_configs
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "decoder_sparse_step": 1,
    "full_attention_interval": 4, "head_dim": 256, "hidden_act": "silu", "hidden_size": 2048,
    "intermediate_size": 5120, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "linear_value_head_dim": 128, "max_position_embeddings": 262144,
    "mlp_only_layers": [], "moe_intermediate_size": 512, "norm_topk_prob": True, "num_attention_heads": 16,
    "num_experts": 512, "num_experts_per_tok": 10, "num_hidden_layers": 48, "num_key_value_heads": 2,
    "partial_rotary_factor": 0.25, "rope_theta": 10000000, "shared_expert_intermediate_size": 512,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_sliding_window": False, "vocab_size": 151936,
}

QWEN3_5 = {  # Qwen/Qwen3.5-397B-A17B: text model under text_config (aiconfigurator model_configs)
    "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
    "text_config": {
        "attention_bias": False, "attn_output_gate": True, "dtype": "bfloat16", "full_attention_interval": 4,
        "head_dim": 256, "hidden_size": 4096,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 15,
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
        "linear_num_value_heads": 64, "linear_value_head_dim": 128, "max_position_embeddings": 262144,
        "mamba_ssm_dtype": "float32", "mlp_only_layers": [], "model_type": "qwen3_5_moe_text",
        "moe_intermediate_size": 1024, "mtp_num_hidden_layers": 1, "num_attention_heads": 32, "num_experts": 512,
        "num_experts_per_tok": 10, "num_hidden_layers": 60, "num_key_value_heads": 2,
        "shared_expert_intermediate_size": 1024, "vocab_size": 248320,
    },
    "tie_word_embeddings": False,
    "vision_config": {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "model_type": "qwen3_5_moe",
                      "num_heads": 16, "patch_size": 16},
}

NEMOTRON_H_56B = {  # nvidia/Nemotron-H-56B-Base-8K (NVIDIA-NeMo/Megatron-Bridge NemotronHModelProvider56B)
    "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "hidden_size": 8192,
    "num_hidden_layers": 118,
    "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-"
                               "M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
    "mamba_num_heads": 256, "mamba_head_dim": 64, "ssm_state_size": 256, "n_groups": 8, "conv_kernel": 4,
    "use_conv_bias": True, "use_bias": False, "chunk_size": 128, "num_attention_heads": 64,
    "num_key_value_heads": 8, "attention_head_dim": 128, "intermediate_size": 32768, "mlp_hidden_act": "relu2",
    "vocab_size": 131072, "max_position_embeddings": 8192, "tie_word_embeddings": False,
}

NEMOTRON_3_NANO = {  # nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B (Megatron-Bridge Nemotron3NanoProvider)
    "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "hidden_size": 2688,
    "num_hidden_layers": 52, "hybrid_override_pattern": "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
    "mamba_num_heads": 64, "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4,
    "use_conv_bias": True, "use_bias": False, "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128,
    "intermediate_size": 1856, "mlp_hidden_act": "relu2", "n_routed_experts": 128, "n_shared_experts": 1,
    "num_experts_per_tok": 6, "moe_intermediate_size": 1856, "moe_shared_expert_intermediate_size": 3712,
    "n_group": 1, "topk_group": 1, "vocab_size": 131072, "max_position_embeddings": 262144,
    "tie_word_embeddings": False,
}

GRANITE_4_H_SMALL = {  # ibm-granite/granite-4.0-h-small (fields quoted in public code; see the model file)
    "architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid", "hidden_size": 4096,
    "num_hidden_layers": 40,
    "layer_types": (["mamba"] * 5 + ["attention"] + ["mamba"] * 4) * 4,
    "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 72, "num_experts_per_tok": 10,
    "intermediate_size": 768, "shared_intermediate_size": 1536, "mamba_n_heads": 128, "mamba_d_head": 64,
    "mamba_n_groups": 1, "mamba_d_state": 128, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_conv_bias": True,
    "mamba_proj_bias": False, "attention_bias": False, "tie_word_embeddings": True, "vocab_size": 100352,
    "embedding_multiplier": 12, "logits_scaling": 8,
}

JAMBA_1_5_MINI = {  # ai21labs/AI21-Jamba-1.5-Mini (HF JambaConfig key names)
    "architectures": ["JambaForCausalLM"], "model_type": "jamba", "hidden_size": 4096, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "attn_layer_period": 8,
    "attn_layer_offset": 4, "expert_layer_period": 2, "expert_layer_offset": 1, "num_experts": 16,
    "num_experts_per_tok": 2, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_dt_rank": 256,
    "mamba_conv_bias": True, "mamba_proj_bias": False, "vocab_size": 65536, "max_position_embeddings": 262144,
    "tie_word_embeddings": False,
}

MINIMAX_M1 = {  # MiniMaxAI/MiniMax-M1 config.json fields (as quoted in public code)
    "architectures": ["MiniMaxM1ForCausalLM"], "model_type": "minimax_m1", "hidden_size": 6144,
    "intermediate_size": 9216, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
    "head_dim": 128, "rotary_dim": 64, "vocab_size": 200064, "rope_theta": 10000000,
    "max_position_embeddings": 10240000, "num_local_experts": 32, "num_experts_per_tok": 2,
    "attn_type_list": [0, 0, 0, 0, 0, 0, 0, 1] * 10, "postnorm": True, "tie_word_embeddings": False,
}

LLAMA_3_3_70B = {  # meta-llama/Llama-3.3-70B-Instruct (aiconfigurator model_configs)
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False, "hidden_size": 8192,
    "intermediate_size": 28672, "max_position_embeddings": 131072, "mlp_bias": False, "num_attention_heads": 64,
    "num_hidden_layers": 80, "num_key_value_heads": 8, "rope_theta": 500000.0, "tie_word_embeddings": False,
    "vocab_size": 128256,
}

CONFIGS = {
    "qwen3-next-80b-a3b": QWEN3_NEXT, "qwen3.5-397b-a17b": QWEN3_5, "nemotron-h-56b": NEMOTRON_H_56B,
    "nemotron-3-nano-30b-a3b": NEMOTRON_3_NANO, "granite-4.0-h-small": GRANITE_4_H_SMALL,
    "jamba-1.5-mini": JAMBA_1_5_MINI, "minimax-m1": MINIMAX_M1, "llama-3.3-70b": LLAMA_3_3_70B,
}
