"""What the graph passes share: queries and rewrites of a Relax main (graph.py), the op chains a
quantized op fuses (chains.py), the recipe each quantized op records (recipe.py), the smooth
activations of epilogues, uint8 value planning, layout views and the float32 leftovers. Imports
nothing from the other subpackages."""
