#!/usr/bin/env python3
"""Write the chat prompt set used to self-distill drafters for SmolLM2-135M-Instruct.
Prompts are composed from hand-written templates x topics per category (deterministic),
and every 8th prompt of each category goes to the held-out split. More topics, tasks and numbers
(the *_MORE lists) add training prompts after those, all of the train split: the held-out prompts
and every earlier prompt's index stay as they were.
  make_prompts.py OUT.json"""
import json, random, sys

TOPICS_QA = ["photosynthesis", "the water cycle", "black holes", "the French Revolution", "vaccines", "inflation",
             "plate tectonics", "the internet", "DNA", "climate change", "the Roman Empire", "electric cars",
             "volcanoes", "the immune system", "machine learning", "the moon landing", "coffee", "sleep",
             "honey bees", "the printing press", "solar panels", "earthquakes", "the stock market", "rainbows",
             "antibiotics", "the Great Wall of China", "dinosaurs", "recycling", "the human heart", "gravity",
             "tea", "the Olympic Games", "blockchain", "tides", "the Renaissance", "bread baking"]
QA = ["What is {t}?", "Can you explain {t} in simple terms?", "Why is {t} important?",
      "Give me three interesting facts about {t}.", "How would you explain {t} to a child?",
      "What are the main advantages and disadvantages of {t}?", "Tell me briefly about the history of {t}.",
      "What is a common misconception about {t}?"]
CHAT = ["Hi! How are you today?", "Can you recommend a good book for a long flight?", "I feel stressed about my exams. Any advice?",
        "What should I cook for dinner tonight?", "How can I be more productive when working from home?",
        "What are some fun things to do on a rainy weekend?", "How do I start learning to play the guitar?",
        "What's a good way to make new friends in a new city?", "Can you suggest a name for my new cat?",
        "How do I politely decline an invitation?", "What are some tips for a job interview?",
        "How can I save money on groceries?", "I want to start running. How should I begin?",
        "What is a healthy breakfast?", "How do I keep my houseplants alive?", "Tell me a joke.",
        "How can I improve my sleep?", "What should I pack for a beach holiday?",
        "How do I write a good thank-you note?", "What hobbies can I do at home?"]
CODE_TASKS = ["reverses a string", "checks whether a number is prime", "computes the factorial of n",
              "returns the n-th Fibonacci number", "counts the vowels in a string", "finds the largest element in a list",
              "removes duplicates from a list", "checks whether a string is a palindrome", "sorts a list with bubble sort",
              "merges two sorted lists", "computes the average of a list of numbers", "converts Celsius to Fahrenheit",
              "reads a text file and counts its lines", "finds the second largest number in a list",
              "flattens a nested list", "counts word frequencies in a sentence", "implements binary search",
              "checks whether two strings are anagrams", "returns the greatest common divisor of two numbers",
              "generates all even numbers up to n"]
CODE = ["Write a Python function that {t}.", "Write a JavaScript function that {t}.",
        "How do I write a function in Python that {t}? Explain the code.", "Write a C function that {t}."]
CODE_EXTRA = ["What is the difference between a list and a tuple in Python?", "Explain what a for loop is.",
              "What does the `git commit` command do?", "Explain recursion with an example.",
              "What is a class in object-oriented programming?", "How do I read a CSV file in Python?",
              "What is the difference between == and is in Python?", "Explain what an API is.",
              "What is a SQL JOIN? Give an example.", "How do I handle exceptions in Python?",
              "What is Big O notation?", "Explain the difference between a stack and a queue."]
NUMS = [(12, 7), (25, 4), (48, 6), (13, 17), (120, 15), (9, 8), (36, 12), (250, 5), (81, 9), (14, 3), (64, 16), (7, 11)]
MATH = ["What is {a} times {b}?", "What is {a} plus {b}? Explain step by step.", "If I have {a} apples and give away {b}, how many are left?",
        "A train travels {a} kilometers in {b} hours. What is its average speed?", "What is {a} divided by {b}?",
        "Tom has {a} marbles. He buys {b} more bags with 3 marbles each. How many marbles does he have now?"]
REASON = ["If all cats are animals and some animals are pets, can we conclude that some cats are pets? Explain.",
          "What is the next number in the sequence 2, 4, 8, 16?", "What is the area of a rectangle 5 meters long and 3 meters wide?",
          "A shirt costs $20 and is on sale for 25% off. What is the sale price?", "How many minutes are there in a day?",
          "If today is Monday, what day will it be in 10 days?", "Solve for x: 2x + 6 = 14.",
          "What is the square root of 144?", "Which is heavier, a kilogram of feathers or a kilogram of steel?",
          "What is 15% of 200?", "A recipe needs 2 eggs per cake. How many eggs are needed for 7 cakes?",
          "What is the perimeter of a square with side length 9?", "Convert 3 hours into seconds.",
          "If a car uses 6 liters of fuel per 100 km, how much does it use for 250 km?"]
WRITE_TOPICS = ["the ocean", "autumn", "a lost dog", "a robot learning to paint", "friendship", "a busy city morning",
                "the first day of school", "a mountain hike", "a rainy night", "a dragon who is afraid of fire",
                "a small bakery", "space travel", "an old lighthouse", "winter", "a garden", "a time traveler"]
WRITE = ["Write a short poem about {t}.", "Write a short story about {t}.", "Write a haiku about {t}.",
         "Write a paragraph describing {t}.", "Write a product description for a candle that smells like {t}."]
WRITE_EXTRA = ["Write an email to my manager asking for a day off next Friday.", "Write a short birthday message for my sister.",
               "Write a cover letter opening for a software developer job.", "Summarize the plot of Romeo and Juliet.",
               "Write a tweet announcing a new coffee shop.", "Write a short speech for a friend's wedding.",
               "Write a motivational message for someone starting a new job.", "Write a review of a pizza restaurant.",
               "Write instructions for making a cup of tea.", "Write a letter to a pen pal introducing yourself."]

TOPICS_QA_MORE = ["the solar system", "bacteria", "the Industrial Revolution", "rivers", "the ancient Egyptians", "nuclear power",
                  "the human brain", "hurricanes", "chocolate", "the Silk Road", "wind turbines", "glaciers", "penguins",
                  "the theory of evolution", "cryptography", "the Eiffel Tower", "batteries", "deserts", "the Cold War",
                  "language learning", "meditation", "coral reefs", "airplanes", "democracy", "the periodic table",
                  "rain forests", "yoga", "the Moon's phases", "video games", "the Amazon river", "3D printing",
                  "wolves", "the Vikings", "nutrition", "satellites", "photography", "the ozone layer", "jazz music",
                  "compound interest", "the Pyramids of Giza", "microplastics", "octopuses", "the Big Bang", "cheese making",
                  "public libraries", "the metric system", "lightning", "the stock exchange", "elephants", "social media"]
CODE_TASKS_MORE = ["capitalizes the first letter of every word", "checks whether a year is a leap year",
                   "computes the sum of the digits of a number", "finds the smallest element in a list",
                   "counts how many times a character appears in a string", "converts a decimal number to binary",
                   "rotates a list by k positions", "returns the intersection of two lists", "checks whether a list is sorted",
                   "computes the power of a number without using the built-in operator", "removes all spaces from a string",
                   "returns the longest word in a sentence", "computes the median of a list", "transposes a matrix",
                   "checks whether a number is a perfect square", "splits a list into chunks of size n"]
NUMS_MORE = [(18, 4), (32, 8), (45, 9), (100, 20), (21, 7), (56, 8), (17, 5), (144, 12), (30, 6), (72, 9), (11, 13), (96, 4)]
WRITE_TOPICS_MORE = ["a quiet library", "the northern lights", "a forgotten toy", "a summer festival", "a snowy forest",
                     "an astronaut's first step", "a cup of coffee", "a train journey", "a kind stranger", "the desert at night",
                     "a cat who wants to fly", "spring flowers", "a haunted house", "a river", "a street musician", "the last day of summer"]


def build_more():
    """Training prompts beyond the first set: new topics, tasks and numbers for the same templates."""
    cats = {
        "chat_qa": [q.format(t=t) for t in TOPICS_QA_MORE for q in QA],
        "code": [c.format(t=t) for t in CODE_TASKS_MORE for c in CODE],
        "math_reasoning": [m.format(a=a, b=b) for a, b in NUMS_MORE for m in MATH],
        "writing": [w.format(t=t) for t in WRITE_TOPICS_MORE for w in WRITE],
    }
    rng = random.Random(20261126)
    out = []
    for cat, items in cats.items():
        items = sorted(set(items))
        rng.shuffle(items)
        out += [{"category": cat, "split": "train", "prompt": p} for p in items]
    return out


def build():
    cats = {
        "chat_qa": CHAT + [q.format(t=t) for t in TOPICS_QA for q in QA],
        "code": [c.format(t=t) for t in CODE_TASKS for c in CODE] + CODE_EXTRA,
        "math_reasoning": [m.format(a=a, b=b) for a, b in NUMS for m in MATH] + REASON,
        "writing": [w.format(t=t) for t in WRITE_TOPICS for w in WRITE] + WRITE_EXTRA,
    }
    rng = random.Random(20261123)
    sizes = {"chat_qa": 120, "code": 80, "math_reasoning": 72, "writing": 80}
    out, rest = [], []
    for cat, items in cats.items():
        items = sorted(set(items))
        rng.shuffle(items)
        for i, p in enumerate(items if cat == "chat_qa" else items[:sizes[cat]]):
            (out if i < sizes[cat] else rest).append(
                {"category": cat, "split": "heldout" if i % 8 == 0 else "train", "prompt": p})
    # the chat prompts past the first 120 come after all the others: the first 352 keep their indices (reply seeds
    # are seed + index, and held-out measures take each category's first prompts)
    return out + rest

if __name__ == "__main__":
    ps = build()
    seen = {p["prompt"] for p in ps}
    ps += [p for p in build_more() if p["prompt"] not in seen]
    json.dump({"about": "chat prompts for self-distillation of SmolLM2-135M-Instruct drafters (tools/train/make_prompts.py)",
               "prompts": ps}, open(sys.argv[1], "w"), indent=1)
    from collections import Counter
    print(Counter((p["category"], p["split"]) for p in ps))
