"""The hooks: wrappers applied to SGLang functions, one subpackage per SGLang process they run in.

``base.py`` (wrapper factories shared by every hook module) and ``registry.py`` (hook id -> implementation)
stay here; ``api/``, ``scheduler/`` and ``detokenizer/`` hold the hook modules of that process. A hook id
is ``<module file stem>.<what>``; the manifests (``patches/*.toml``) give each its ``process``.
"""
