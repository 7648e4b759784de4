from torch import nn


def small_cnn(width: int = 32) -> nn.Module:
    """3x32x32 images in, 10 logits out."""

    def block(c_in: int, c_out: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )

    return nn.Sequential(
        block(3, width),
        block(width, 2 * width),
        block(2 * width, 4 * width),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4 * width, 10),
    )
