"""The demo model's pipeline: corpus, training, export, quantization, evaluation."""
