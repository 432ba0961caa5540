"""Whole-step compilation: ``gd.function``, concrete functions and plans."""

from graphdist.compile.function import ConcreteFunction, Function, function
from graphdist.compile.load import load_plan
from graphdist.compile.loaded import LoadedPlan
from graphdist.compile.plan import Plan, Segment

__all__ = ["function", "Function", "ConcreteFunction", "Plan", "Segment", "LoadedPlan", "load_plan"]
