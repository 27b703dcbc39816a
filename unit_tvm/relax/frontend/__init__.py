"""Repairs of what TVM's model frontends produce (fixes.frontend_fixes runs them all): 1-D convs
lifted to 2-D, GELU and safe-softmax spellings read back as one op."""
