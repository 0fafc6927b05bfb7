import os
import sys
import unittest

sys.path.insert(0, os.environ.get("REROLL_WORKSPACE", "/app"))
from calc import add, mean


class HiddenTest(unittest.TestCase):
    def test_mean(self):
        self.assertEqual(mean([1, 2, 3]), 2)
        self.assertEqual(mean([4]), 4)
        self.assertAlmostEqual(mean([1, 2]), 1.5)

    def test_add(self):
        self.assertEqual(add(-1, 1), 0)


if __name__ == "__main__":
    unittest.main()
