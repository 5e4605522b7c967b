"""The toy worlds: images of coloured shapes (``scenes``) and videos of them moving (``clips``); docs/toy_world.md."""
