"""The launch layer: turns a call's decisions (``ioattn.plan``) and its tensors into kernel launches:
buffers, TMA descriptors, padding, grids and walk tables."""
