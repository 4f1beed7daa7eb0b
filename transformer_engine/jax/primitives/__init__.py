"""XLA FFI primitives: each op's custom call on a GPU and its jnp reference elsewhere
(registry.py decides per trace)."""
