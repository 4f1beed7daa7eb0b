"""The parts the modules in ``transformer_engine.pytorch.module`` are built from: constructor
options (``nv_options``, ``norm_args``), input checks, tensor/sequence-parallel collectives
(``parallel``, ``sequence_parallel_fp8``), weight-gradient routing (``wgrad``), the block-scaled
FP8 step (``blockwise``), ``save_original_input`` (``original_input``) and the side-stream work of
the FP8 sequence-parallel step (``side_stream``, ``weight_cast_beside``). Private to the library."""
