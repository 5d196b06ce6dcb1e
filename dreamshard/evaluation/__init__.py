"""Evaluation: collecting real plan costs, measuring sharders' plans, lower bounds, exhaustive optima, reports."""
