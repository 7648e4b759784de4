"""A trained model put to use: rebuilt from a checkpoint to classify images (``inference``), and exported to
safetensors, pt2, ONNX or TorchScript, each verified (``exporting``; the formats, one record each: ``formats``).
Imports ``training`` and the floors below it."""
