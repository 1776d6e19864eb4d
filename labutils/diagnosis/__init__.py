"""Naming the cause: the catalogue (``causes``), the evidence of a run or an exception (``evidence``,
``chain``, ``tree``, ``pickling``, ``logread``), the rules over it (``rules``, ``decide``) and the
``Diagnosis`` they give (``diagnose``, ``model``)."""

from .._lazy import submodule_getattr

__getattr__ = submodule_getattr(__name__)
