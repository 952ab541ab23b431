// Tests for this tier are added with the module they test (docs/TESTING.md).
