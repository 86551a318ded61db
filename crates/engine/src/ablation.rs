//! Test switches (test builds only): one feature turned off or changed at a time, named
//! as the sensitivity tables of `tools/reference/README.md` name the same perturbation
//! of the reference. Tests show that each broken variant fails the fixture comparison
//! by about the margin the reference itself moves. The CPU backend's operations and the
//! families check the switch with [`crate::ablated!`], which is `false` outside tests,
//! so release builds carry none of it.

/// One deliberate deviation from the reference (see the module header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ablation {
    /// Sinkhorn stopped after the softmax and one column normalisation.
    HcSinkhorn1,
    /// Sinkhorn with one iteration fewer than configured.
    HcSinkhorn19,
    /// Residual mixing with `C` instead of `Cᵀ`.
    HcCombTransposed,
    /// `post` weights forced to 1.
    HcPostOnes,
    /// `pre` weights replaced by `1 / hc_mult`.
    HcPreMean,
    /// No RMS normalisation of the flattened streams before `fn`.
    HcInputNormOff,
    /// `hc_eps = 0`.
    HcEps0,
    /// The final collapse takes stream 0 instead of the mean.
    HcHeadFirstStream,
    /// Depthwise conv replaced by identity (SiLU kept).
    KdaConvIdentity,
    /// No SiLU after the conv.
    KdaConvNoSilu,
    /// Recurrent state not carried across 64-token chunks within a call.
    KdaChunkStateReset,
    /// Conv state zeroed before every decode step.
    KdaDecodeConvStateZeroed,
    /// Recurrent state zeroed before every decode step.
    KdaDecodeStateZeroed,
    /// The other forget-gate form (lower bound ↔ softplus).
    KdaGateOtherForm,
    /// `A_log = 0`.
    KdaALogZero,
    /// `dt_bias = 0`.
    KdaDtBiasZero,
    /// `beta = 1`.
    KdaBetaOne,
    /// q/k not L2-normalised.
    KdaQkL2normOff,
    /// Gated output norm without the sigmoid gate.
    KdaOutputGateOff,
    /// Gated output norm weight = 1.
    KdaONormWeightOnes,
    /// No `q_a_layernorm`.
    MlaQANormOff,
    /// No `kv_a_layernorm` (latent not normalised).
    MlaKvANormOff,
    /// Softmax scale `1/sqrt(v_head_dim)`.
    MlaScaleVHeadDim,
    /// Every causal token selected (dense attention).
    DsaDense,
    /// The incomplete kpool tail not appended.
    DsaNoTail,
    /// Pooled key = plain mean (no gate, no ape).
    DsaPoolPlainMean,
    /// kpool ape zero.
    DsaApeOff,
    /// Head scores not ReLU'd.
    DsaReluOff,
    /// Head weights replaced by 1.
    DsaHeadWeightsOnes,
    /// No indexer `k_norm`.
    DsaKNormOff,
    /// `shared` layers attend to every causal token.
    DsaSharedDense,
    /// Router correction bias ignored.
    MoeBiasOff,
    /// Routing weights from the biased scores.
    MoeWeightsWithBias,
    /// Group-limited selection disabled.
    MoeGroupsOff,
    /// `norm_topk_prob` flipped.
    MoeRenormFlipped,
    /// `routed_scaling_factor = 1`.
    MoeRoutedScaling1,
    /// Shared expert dropped.
    MoeSharedExpertOff,
    /// No SwiGLU clamp.
    SwigluClampOff,
    /// Gate also clamped below at `-limit`.
    SwigluGateClampedBelow,
    /// Final RMSNorm removed.
    FinalNormOff,
    // DeepSeek-V4 (names in `Ablation::DEEPSEEK4`).
    /// The final hyper-head collapse is the plain mean of the streams.
    HcHeadMean,
    /// Attention sinks removed (sink logit −inf).
    SinksOff,
    /// Attention sink logits 0.
    SinksZero,
    /// No unweighted RMSNorm of the per-head queries.
    QBNormOff,
    /// No `kv_norm` on the shared key/value.
    KvNormOff,
    /// The attention output's rope slice not rotated back.
    NoInverseRopeOnOutput,
    /// RoPE in NeoX halves instead of interleaved pairs, everywhere.
    RopeNeoxPairs,
    /// RoPE on the leading instead of the trailing channels, everywhere.
    RopeLeadingDims,
    /// Compressed layers use the main rope.
    CompressRopeMainTheta,
    /// The compress rope without YaRN.
    CompressRopeNoYarn,
    /// Sliding layers use the compress rope.
    MainRopeCompressTheta,
    /// Sliding window one token shorter.
    SlidingWindowMinus1,
    /// Grouped output projection with the head groups in reverse order.
    WoAGroupsSwapped,
    /// No compressed entries in the attention.
    CompressionOff,
    /// No `kv_norm` on the compressed entries.
    CompressorNormOff,
    /// The indexer selects every visible entry.
    IndexerSelectAll,
    /// Indexer queries and keys not rotated.
    IndexerNoRope,
    /// No `kv_norm` on the indexer's keys.
    IndexerNormOff,
    /// Hash layers route by the top-k of their scores.
    HashRoutingAsScore,
    /// Router scores by sigmoid instead of sqrt(softplus).
    MoeScoreSigmoid,
    /// Routing weights not renormalised.
    MoeNoRenorm,
}

impl Ablation {
    /// Every switch, with the name the reference's sensitivity table uses.
    pub const ALL: &[(Ablation, &'static str)] = &[
        (Ablation::HcSinkhorn1, "hc_sinkhorn_1"),
        (Ablation::HcSinkhorn19, "hc_sinkhorn_19"),
        (Ablation::HcCombTransposed, "hc_comb_transposed"),
        (Ablation::HcPostOnes, "hc_post_ones"),
        (Ablation::HcPreMean, "hc_pre_mean"),
        (Ablation::HcInputNormOff, "hc_input_norm_off"),
        (Ablation::HcEps0, "hc_eps_0"),
        (Ablation::HcHeadFirstStream, "hc_head_first_stream"),
        (Ablation::KdaConvIdentity, "kda_conv_identity"),
        (Ablation::KdaConvNoSilu, "kda_conv_no_silu"),
        (Ablation::KdaChunkStateReset, "kda_chunk_state_reset"),
        (
            Ablation::KdaDecodeConvStateZeroed,
            "kda_decode_conv_state_zeroed",
        ),
        (Ablation::KdaDecodeStateZeroed, "kda_decode_state_zeroed"),
        (Ablation::KdaGateOtherForm, "kda_gate_other_form"),
        (Ablation::KdaALogZero, "kda_A_log_zero"),
        (Ablation::KdaDtBiasZero, "kda_dt_bias_zero"),
        (Ablation::KdaBetaOne, "kda_beta_one"),
        (Ablation::KdaQkL2normOff, "kda_qk_l2norm_off"),
        (Ablation::KdaOutputGateOff, "kda_output_gate_off"),
        (Ablation::KdaONormWeightOnes, "kda_o_norm_weight_ones"),
        (Ablation::MlaQANormOff, "mla_q_a_norm_off"),
        (Ablation::MlaKvANormOff, "mla_kv_a_norm_off"),
        (Ablation::MlaScaleVHeadDim, "mla_scale_v_head_dim"),
        (Ablation::DsaDense, "dsa_dense"),
        (Ablation::DsaNoTail, "dsa_no_tail"),
        (Ablation::DsaPoolPlainMean, "dsa_pool_plain_mean"),
        (Ablation::DsaApeOff, "dsa_ape_off"),
        (Ablation::DsaReluOff, "dsa_relu_off"),
        (Ablation::DsaHeadWeightsOnes, "dsa_head_weights_ones"),
        (Ablation::DsaKNormOff, "dsa_k_norm_off"),
        (Ablation::DsaSharedDense, "dsa_shared_dense"),
        (Ablation::MoeBiasOff, "moe_bias_off"),
        (Ablation::MoeWeightsWithBias, "moe_weights_with_bias"),
        (Ablation::MoeGroupsOff, "moe_groups_off"),
        (Ablation::MoeRenormFlipped, "moe_renorm_flipped"),
        (Ablation::MoeRoutedScaling1, "moe_routed_scaling_1"),
        (Ablation::MoeSharedExpertOff, "moe_shared_expert_off"),
        (Ablation::SwigluClampOff, "swiglu_clamp_off"),
        (
            Ablation::SwigluGateClampedBelow,
            "swiglu_gate_clamped_below",
        ),
        (Ablation::FinalNormOff, "final_norm_off"),
    ];

    /// The switches that apply to DeepSeek-V4, with the names of its sensitivity table
    /// (`tools/reference/README.md`); several reuse GLM-5.3's switches for the same
    /// perturbation.
    pub const DEEPSEEK4: &[(Ablation, &'static str)] = &[
        (Ablation::HcSinkhorn1, "hc_sinkhorn_1"),
        (Ablation::HcSinkhorn19, "hc_sinkhorn_minus_1"),
        (Ablation::HcCombTransposed, "hc_comb_transposed"),
        (Ablation::HcPostOnes, "hc_post_ones"),
        (Ablation::HcPreMean, "hc_pre_mean"),
        (Ablation::HcInputNormOff, "hc_input_norm_off"),
        (Ablation::HcEps0, "hc_eps_0"),
        (Ablation::HcHeadMean, "hc_head_mean"),
        (Ablation::SinksOff, "sinks_off"),
        (Ablation::SinksZero, "sinks_zero"),
        (Ablation::QBNormOff, "q_b_norm_off"),
        (Ablation::KvNormOff, "kv_norm_off"),
        (Ablation::NoInverseRopeOnOutput, "no_inverse_rope_on_output"),
        (Ablation::RopeNeoxPairs, "rope_neox_pairs"),
        (Ablation::RopeLeadingDims, "rope_leading_dims"),
        (Ablation::CompressRopeMainTheta, "compress_rope_main_theta"),
        (Ablation::CompressRopeNoYarn, "compress_rope_no_yarn"),
        (Ablation::MainRopeCompressTheta, "main_rope_compress_theta"),
        (Ablation::SlidingWindowMinus1, "sliding_window_minus_1"),
        (Ablation::WoAGroupsSwapped, "wo_a_groups_swapped"),
        (Ablation::CompressionOff, "compression_off"),
        (Ablation::DsaApeOff, "compressor_ape_off"),
        (Ablation::CompressorNormOff, "compressor_norm_off"),
        (Ablation::IndexerSelectAll, "indexer_select_all"),
        (Ablation::DsaReluOff, "indexer_relu_off"),
        (Ablation::DsaHeadWeightsOnes, "indexer_head_weights_ones"),
        (Ablation::IndexerNoRope, "indexer_no_rope"),
        (Ablation::IndexerNormOff, "indexer_norm_off"),
        (Ablation::HashRoutingAsScore, "hash_routing_as_score"),
        (Ablation::MoeBiasOff, "moe_bias_off"),
        (Ablation::MoeWeightsWithBias, "moe_weights_with_bias"),
        (Ablation::MoeScoreSigmoid, "moe_score_sigmoid"),
        (Ablation::MoeNoRenorm, "moe_no_renorm"),
        (Ablation::MoeRoutedScaling1, "moe_routed_scaling_1"),
        (Ablation::MoeSharedExpertOff, "moe_shared_expert_off"),
        (Ablation::SwigluClampOff, "swiglu_clamp_off"),
        (
            Ablation::SwigluGateClampedBelow,
            "swiglu_gate_clamped_below",
        ),
        (Ablation::FinalNormOff, "final_norm_off"),
    ];

    /// The reference's name of this switch.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .chain(Self::DEEPSEEK4)
            .find(|(a, _)| *a == self)
            .map_or("?", |(_, n)| n)
    }
}
