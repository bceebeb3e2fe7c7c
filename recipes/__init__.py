"""WHAT to build: recipe loading/validation and the one table of GPU architectures."""

from bwstack.recipes.archs import ARCHS, Arch, arch_for_cc, cc_text, parse_arch, parse_arch_list
from bwstack.recipes.recipe import Recipe, available_recipes, load_recipe

__all__ = [
    "ARCHS",
    "Arch",
    "Recipe",
    "arch_for_cc",
    "available_recipes",
    "cc_text",
    "load_recipe",
    "parse_arch",
    "parse_arch_list",
]
