"""What greedy, beam and streaming decoding share: the fused n-gram LM and boosting models, module introspection."""
