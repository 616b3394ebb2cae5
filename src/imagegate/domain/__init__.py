"""The domain's values: results and levels, the plan, the evidence layout, the protocol, the probes bundle, GPU requests, the serve stage's model."""
