"""GLM-4.5 / 4.6 / Air (`glm4moe`): sigmoid routing with a selection bias, shared experts, leading
dense layers, and a NextN (MTP) block after the trunk. The forward pass is transformer.py's."""

from runner.models.family import Family

GLM4MOE = Family(
    arch="glm4moe",
    ffn_norm="post_attention_norm.weight",
    router_bias=True,
    shared_experts=True,
    leading_dense=True,
    nextn=True,
    gating_default=2,
    weights_norm_from_file=True,
    rms_eps_synth=1e-5,
)
