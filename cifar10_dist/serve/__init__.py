"""A trained model put to use: rebuilt from a checkpoint to classify images (``inference``), and exported to
safetensors, TorchScript or ONNX, each verified (``exporting``). Imports ``training`` and the floors below it."""
