"""torch.library registration of the native ops used by the modules, so that torch.compile
(fullgraph=True) traces the modules: each op is a custom op with a fake (shape-only)
implementation. `dispatch` is what the modules call: the eager op directly (no dispatcher
overhead) or, while torch.compile traces, the registered op."""
from . import dispatch  # noqa: F401
