"""Texts that exercise tokenizers: code, numbers, scripts, emoji, whitespace runs."""

TEXTS = [
    "Hello world!",
    "The capital of France is Paris, a city on the river Seine.",
    "The year 2024 had 366 days; 3.14159 is pi and 1,000,000 is a million.",
    "def square(x):\n    return x ** 2  # comment\n\n\nclass A:\n\tpass\n",
    "Ünïcödé façade naïve — “quotes” ‘single’ café",
    "日本語のテキストと中文字符，한국어",
    "emoji 🎉🚀👍🏽 and a family 👨‍👩‍👧",
    "multiple   spaces\n\n\nnewlines \t tabs   \r\n windows",
    "it's don't we'll I'M THEY'RE",
    "x" * 40 + " " + "ab" * 20,
    "12345678901234567890",
    "",
]
