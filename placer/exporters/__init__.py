"""A plan in serving engines' terms, one module per engine: `sglang` (expert-parallel homes for
`--init-expert-location`), `ktransformers` (sglang-kt's GPU expert set), `llamacpp` (the
layer-offload baseline as tensor overrides). `output` holds what they share."""
