"""Calibration: measure the machine at hand (``pl.calibrate``) or the model at hand (``calibrate_model``)."""

from pipelab.calibrate.in_run import allreduce_in_run, ring_latency_of, runtime_overhead
from pipelab.calibrate.machine import BACKENDS, DEFAULT_SIZES, calibrate, check, load
from pipelab.calibrate.model import ModelRuns, calibrate_model

__all__ = ["BACKENDS", "DEFAULT_SIZES", "ModelRuns", "allreduce_in_run", "calibrate", "calibrate_model",
           "check", "load", "ring_latency_of", "runtime_overhead"]
