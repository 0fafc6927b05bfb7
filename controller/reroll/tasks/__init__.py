"""Tasks: loading (native, Harbor, SkillsBench, BenchFlow layouts), compatibility notes, checks."""
