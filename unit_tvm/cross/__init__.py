"""Cross targets checked by execution: aarch64 kernels run under qemu-user."""
