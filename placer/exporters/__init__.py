"""A plan in serving engines' terms, one module per engine: `sglang` (expert-parallel homes
or the calibration load for `--init-expert-location`), `trtllm` (TensorRT-LLM's static
expert placement, `moe_config.load_balancer`), `ktransformers` (sglang-kt's GPU expert set),
`llamacpp` (the layer-offload baseline as tensor overrides). `output` holds what they
share."""
