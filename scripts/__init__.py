"""Measurement and benchmark harnesses and the demo model's pipeline; run each as `python -m scripts.<group>.<name>`."""
