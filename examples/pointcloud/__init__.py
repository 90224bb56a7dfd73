"""A small point-cloud segmentation task for the pimm_fn examples.

Procedural scenes (:mod:`.data`), a tiny PointNet-style network
(:mod:`.model`) and a sharded, all-reducing evaluator (:mod:`.metrics`).
Everything is CPU-friendly and needs no download.
"""

from pointcloud.data import CLASSES, FEAT_DIM, NUM_CLASSES, SyntheticScenes, collate, make_loaders, shard
from pointcloud.metrics import Evaluator, confusion_matrix, iou_per_class, miou
from pointcloud.model import PointSegNet

__all__ = [
    "CLASSES",
    "FEAT_DIM",
    "NUM_CLASSES",
    "SyntheticScenes",
    "collate",
    "make_loaders",
    "shard",
    "Evaluator",
    "confusion_matrix",
    "iou_per_class",
    "miou",
    "PointSegNet",
]
