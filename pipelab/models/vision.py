"""The image models of the papers, from torchvision, built without pretrained weights."""

from __future__ import annotations

from torch import nn


def vgg16(num_classes: int = 1000) -> nn.Module:
    """VGG-16 (Simonyan & Zisserman 2015), torchvision's layout: 138,357,544 parameters at 1000 classes;
    any image side >= 32 works (an adaptive pool)."""
    from torchvision.models import vgg16 as tv_vgg16

    return tv_vgg16(weights=None, num_classes=num_classes)


def resnet50(num_classes: int = 1000) -> nn.Module:
    """ResNet-50 (He et al. 2016), torchvision's layout: 25,557,032 parameters at 1000 classes."""
    from torchvision.models import resnet50 as tv_resnet50

    return tv_resnet50(weights=None, num_classes=num_classes)
