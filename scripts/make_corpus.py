#!/usr/bin/python3
"""Write the quickstart corpus: short, readable English stories, generated deterministically.

    /usr/bin/python3 scripts/make_corpus.py                    # corpus.txt, ~3 MB
    /usr/bin/python3 scripts/make_corpus.py --tokenizer        # ... and tokenizer.model
    /usr/bin/python3 scripts/make_corpus.py --out /tmp/c.txt --size-mb 0.2 --jsonl /tmp/c.jsonl

Why templated stories: a tiny model trained for a few hundred steps must show a clearly
falling loss. The stories repeat a small grammar (so the loss falls fast) with a varied
vocabulary and names that recur inside a story (so there is something to learn beyond
unigram counts: agreement, copying a name, story order). Documents are separated by one blank
line, which is the document boundary of `ft tokenize --format text`.

The output depends only on --seed and --size-mb (Python's random.Random is stable across
versions for the calls used here: random(), randrange(), choice() on lists). The standard
library is all the corpus needs; --tokenizer runs the `spm_train` binary (Debian package
`sentencepiece`) with flags that make the model a function of the corpus alone.
"""

import argparse
import json
import os
import random
import shutil
import subprocess
import sys

DEFAULT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "generated",
                           "quickstart")

NAMES_GIRL = ["Mia", "Lily", "Anna", "Rosa", "Ella", "Nora", "Zoe", "Ivy", "Ruby", "Maya", "Lucy",
              "Sara", "Emma", "Hana", "Julia", "Clara", "Greta", "Olivia", "Priya", "Fatima",
              "Sofia", "Chloe", "Amara", "Beatrice", "Daisy", "Esther", "Freya", "Imogen",
              "Jasmine", "Keiko", "Matilda", "Penelope"]
NAMES_BOY = ["Tom", "Ben", "Sam", "Leo", "Max", "Jack", "Omar", "Finn", "Noah", "Eli", "Hugo",
             "Adam", "Liam", "Theo", "Oscar", "Ravi", "Arthur", "Felix", "George", "Henry",
             "Isaac", "Jonah", "Kenji", "Lucas", "Milo", "Nathan", "Pablo", "Rupert", "Simon",
             "Tobias", "Victor", "William"]
ANIMALS = ["rabbit", "fox", "bear", "cat", "dog", "mouse", "owl", "duck", "frog", "squirrel",
           "turtle", "pig", "goat", "lamb", "hedgehog", "badger", "deer", "crow", "bee", "horse",
           "penguin", "elephant", "giraffe", "monkey", "tiger", "lion", "zebra", "kangaroo",
           "dolphin", "whale", "parrot", "beaver", "otter", "raccoon", "chicken", "donkey",
           "butterfly", "ladybug", "snail", "lizard"]
SIZES = ["little", "small", "big", "tiny", "young", "old"]
TRAITS = ["kind", "brave", "curious", "shy", "clever", "happy", "quiet", "funny", "gentle",
          "busy", "careful", "friendly", "cheerful", "polite", "patient", "generous", "honest",
          "playful", "sleepy", "hungry", "grumpy", "thoughtful", "lively", "proud"]
COLORS = ["red", "blue", "green", "yellow", "white", "brown", "orange", "purple", "gray", "pink"]
PLACES = ["the forest", "the river", "the hill", "the village", "the garden", "the farm",
          "the lake", "the beach", "the meadow", "the old mill", "the market", "the park",
          "the valley", "the school", "the bridge", "the library", "the bakery", "the harbor",
          "the mountain", "the cave", "the orchard", "the island", "the castle", "the station",
          "the playground", "the museum", "the desert", "the jungle", "the pond", "the lighthouse"]
CROSSINGS = ["the bridge", "the river", "the meadow", "the hill", "the field", "the stream",
             "the valley", "the old road", "the wooden bridge", "the sand dunes"]
HOMES = ["a small house", "a warm burrow", "a wooden cabin", "a cozy nest", "a tall tree",
         "a blue cottage", "a little hut", "an old barn"]
OBJECTS = ["ball", "kite", "box", "hat", "book", "key", "cup", "basket", "drum", "boat",
           "lamp", "map", "shell", "stone", "bell", "blanket", "apple", "flower", "feather",
           "coin", "ribbon", "jar", "wheel", "spoon", "umbrella", "scarf", "pencil", "violin",
           "trumpet", "compass", "lantern", "bucket", "ladder", "mirror", "necklace", "pillow",
           "puzzle", "rocket", "sandal", "telescope", "whistle", "backpack", "candle", "marble",
           "paintbrush", "notebook", "bicycle", "teapot", "crown", "envelope"]
SHINY = ["shiny", "strange", "broken", "heavy", "soft", "round", "tiny", "golden", "dusty", "new"]
FOODS = ["apples", "carrots", "berries", "bread", "cheese", "soup", "honey", "nuts", "pears",
         "cookies", "rice", "plums", "pancakes", "peaches", "strawberries", "potatoes",
         "cherries", "noodles", "muffins", "oranges", "grapes", "lemons", "tomatoes", "cupcakes",
         "sandwiches", "pumpkins", "walnuts", "bananas"]
HOBBIES = ["sing songs", "draw pictures", "read books", "play games", "dance", "build towers",
           "watch the birds", "collect stones", "plant seeds", "fly kites", "swim", "bake bread",
           "paint flowers", "climb trees", "write letters", "knit scarves", "catch butterflies",
           "count clouds", "ride bicycles", "juggle oranges", "whistle tunes", "skip stones",
           "solve puzzles", "tell jokes", "make sandcastles", "explore caves"]
WEATHER = ["the sun was bright", "it was raining", "the wind was cold", "the sky was gray",
           "snow was falling", "the air was warm", "fog covered the fields", "the stars were out"]
TIMES = ["One morning", "One day", "One evening", "Later that week", "On a sunny afternoon",
         "After lunch", "Early one spring day", "On a cold winter night"]
FEELINGS_GOOD = ["happy", "glad", "proud", "excited", "calm", "thankful"]
FEELINGS_BAD = ["sad", "worried", "scared", "tired", "lonely", "upset"]
PROBLEMS = ["lost {poss} {obj}", "could not find the way home", "dropped {poss} {obj} in the water",
            "was too small to reach the {obj}", "got stuck in the mud", "broke {poss} {obj}"]
HELPERS = ["a wise owl", "an old turtle", "a kind farmer", "a friendly dog", "a tall giraffe",
           "a busy bee", "a gentle horse", "a clever crow"]
LESSONS = ["friends help each other", "it is good to share", "being brave is not easy but it is "
           "worth it", "asking for help is a good idea", "patience makes hard things easy",
           "kindness comes back to you", "every problem has a solution", "it is fun to try new things"]
NUMBERS = ["two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]


class Character:
    def __init__(self, rng, used):
        self.girl = rng.random() < 0.5
        pool = [n for n in (NAMES_GIRL if self.girl else NAMES_BOY) if n not in used]
        self.name = rng.choice(pool)
        used.add(self.name)
        self.animal = rng.choice(ANIMALS)
        self.trait = rng.choice(TRAITS)
        self.size = rng.choice(SIZES)
        self.he = "she" if self.girl else "he"
        self.him = "her" if self.girl else "him"
        self.his = "her" if self.girl else "his"


def a_or_an(word):
    return ("an " if word[0] in "aeiou" else "a ") + word


def plural(noun):
    irregular = {"mouse": "mice", "deer": "deer"}
    if noun in irregular:
        return irregular[noun]
    if noun.endswith(("s", "x", "ch", "sh")):
        return noun + "es"
    if noun.endswith("y") and noun[-2] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


def cap(s):
    return s[0].upper() + s[1:]


def story_lost_object(rng):
    used = set()
    c, f = Character(rng, used), Character(rng, used)
    obj, color, place = rng.choice(OBJECTS), rng.choice(COLORS), rng.choice(PLACES)
    s = [f"Once upon a time, there was {a_or_an(c.size)} {c.animal} named {c.name}.",
         f"{c.name} lived in {rng.choice(HOMES)} near {rng.choice(PLACES)}.",
         f"{c.name} had {a_or_an(color)} {obj} and loved it very much.",
         f"{rng.choice(TIMES)}, {c.name} went to {place} to {rng.choice(HOBBIES)}.",
         f"When {c.he} came back, the {color} {obj} was gone!",
         f"{c.name} felt {rng.choice(FEELINGS_BAD)}. {cap(c.he)} looked under the bed and behind the door.",
         f"Then {c.his} friend {f.name} the {f.animal} came to visit.",
         f"\"Why are you so {rng.choice(FEELINGS_BAD)}, {c.name}?\" asked {f.name}.",
         f"\"I lost my {color} {obj},\" said {c.name}.",
         f"\"Do not worry. I will help you,\" said {f.name}.",
         f"They walked back to {place} together.",
         f"There, next to {a_or_an(rng.choice(SHINY))} {rng.choice(OBJECTS)}, they found the {color} {obj}.",
         f"{c.name} was so {rng.choice(FEELINGS_GOOD)} that {c.he} hugged {f.name}.",
         f"From that day on, {c.name} and {f.name} were best friends."]
    return " ".join(s)


def story_daily(rng):
    c = Character(rng, set())
    food, hobby = rng.choice(FOODS), rng.choice(HOBBIES)
    n = rng.choice(NUMBERS)
    s = [f"{c.name} is {a_or_an(c.trait)} {c.animal}.",
         f"Every morning, {c.name} wakes up early and eats {n} {food}.",
         f"Then {c.he} goes to {rng.choice(PLACES)}.",
         f"{c.name} likes to {hobby} with {c.his} friends.",
         f"Today {rng.choice(WEATHER)}, so {c.name} stayed near {rng.choice(PLACES)}.",
         f"{cap(c.he)} met {rng.choice(HELPERS)} who said hello.",
         f"In the evening, {c.name} went home, ate some {rng.choice(FOODS)}, and went to sleep.",
         f"{c.name} was {rng.choice(FEELINGS_GOOD)}. It had been a good day."]
    return " ".join(s)


def story_problem(rng):
    used = set()
    c = Character(rng, used)
    obj = rng.choice(OBJECTS)
    helper = rng.choice(HELPERS)
    problem = rng.choice(PROBLEMS).format(poss=c.his, obj=obj)
    lesson = rng.choice(LESSONS)
    s = [f"{rng.choice(TIMES)}, {rng.choice(WEATHER)}.",
         f"{a_or_an(c.trait).capitalize()} {c.animal} called {c.name} {problem}.",
         f"{c.name} sat down and began to cry.",
         f"Soon {helper} came by and asked, \"What is wrong, little {c.animal}?\"",
         f"{c.name} told {helper.split(' ', 1)[1]} everything.",
         f"\"Let us think together,\" said the {helper.split(' ')[-1]}.",
         f"They tried once, and they tried twice, and on the third try it worked.",
         f"{c.name} said, \"Thank you!\" and smiled.",
         f"That day {c.name} learned that {lesson}."]
    return " ".join(s)


def story_counting(rng):
    c = Character(rng, set())
    food = rng.choice(FOODS)
    a, b = rng.randrange(2, 6), rng.randrange(1, 5)  # a >= 2: the food words are plural
    words = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
    s = [f"{c.name} the {c.animal} had {words[a]} {food} in {a_or_an(rng.choice(COLORS))} basket.",
         f"{cap(c.his)} friend gave {c.him} {words[b]} more.",
         f"Now {c.name} had {words[a + b]} {food}.",
         f"{c.name} counted them: " + ", ".join(words[1:a + b + 1]) + ".",
         f"\"I will share them,\" said {c.name}, and {c.he} gave one to each friend.",
         f"Everyone said that {c.name} was very {rng.choice(TRAITS)}."]
    return " ".join(s)


def story_trip(rng):
    used = set()
    c, f = Character(rng, used), Character(rng, used)
    place1, place2 = rng.sample(PLACES, 2)
    obj = rng.choice(OBJECTS)
    s = [f"{c.name} and {f.name} wanted to go on a trip.",
         f"They packed {a_or_an(rng.choice(COLORS))} bag with {rng.choice(FOODS)}, a {obj}, and a warm blanket.",
         f"First they walked to {place1}.",
         f"At {place1}, they saw {rng.choice(NUMBERS)} {plural(rng.choice(ANIMALS))} playing in the grass.",
         f"Then they crossed {rng.choice(CROSSINGS)} and arrived at {place2}.",
         f"{rng.choice(WEATHER).capitalize()}, so they sat down and had lunch.",
         f"{f.name} said, \"This is the best trip ever!\"",
         f"{c.name} laughed and said, \"Let us come back tomorrow.\"",
         f"When the sun went down, they walked home, tired and {rng.choice(FEELINGS_GOOD)}."]
    return " ".join(s)


SEASONS = [("spring", "the flowers opened"), ("summer", "the days were long and hot"),
           ("autumn", "the leaves turned orange"), ("winter", "the ponds froze")]
CHORES = ["sweep the floor", "wash the dishes", "feed the chickens", "water the plants",
          "carry the firewood", "mend the fence", "paint the gate", "pick the vegetables",
          "fold the laundry", "polish the windows", "stack the books", "fix the roof"]
ADVERBS = ["quickly", "slowly", "carefully", "happily", "quietly", "proudly", "bravely",
           "patiently", "gently", "eagerly"]


def story_season(rng):
    used = set()
    c, f = Character(rng, used), Character(rng, used)
    season, sign = rng.choice(SEASONS)
    chore1, chore2 = rng.sample(CHORES, 2)
    s = [f"It was {season}, and {sign}.",
         f"{c.name} the {c.trait} {c.animal} had a lot of work to do.",
         f"{cap(c.he)} had to {chore1} and {chore2} before dinner.",
         f"{c.name} worked {rng.choice(ADVERBS)}, but the work was hard.",
         f"{f.name} the {f.animal} saw {c.him} and asked, \"May I help you?\"",
         f"\"Yes, please,\" said {c.name}. \"Can you {chore2}?\"",
         f"{f.name} nodded and began to {chore2} {rng.choice(ADVERBS)}.",
         f"Together they finished everything before the sun went down.",
         f"To say thank you, {c.name} shared some {rng.choice(FOODS)} with {f.name}.",
         f"\"Working together is more fun,\" said {f.name}, and {c.name} agreed."]
    return " ".join(s)


STORIES = [story_lost_object, story_daily, story_problem, story_counting, story_trip, story_season]


def generate(size_bytes, seed):
    """Yields stories until their total size reaches size_bytes."""
    rng = random.Random(seed)
    total = 0
    while total < size_bytes:
        story = rng.choice(STORIES)(rng)
        total += len(story) + 2
        yield story


def train_tokenizer(corpus, model_path, vocab_size):
    spm_train = shutil.which("spm_train")
    if not spm_train:
        sys.exit("make_corpus.py: spm_train not found (apt-get install sentencepiece)")
    prefix = model_path[:-len(".model")] if model_path.endswith(".model") else model_path
    # Deterministic: every sentence is used (no sampling), in file order, by one thread;
    # ids fixed to what the quickstart recipe and ft tokenize expect.
    cmd = [spm_train, f"--input={corpus}", f"--model_prefix={prefix}", f"--vocab_size={vocab_size}",
           "--model_type=bpe", "--character_coverage=1.0", "--input_sentence_size=0",
           "--shuffle_input_sentence=false", "--num_threads=1", "--random_seed=1",
           "--unk_id=0", "--bos_id=1", "--eos_id=2", "--pad_id=-1", "--minloglevel=2"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    os.remove(prefix + ".vocab")  # only the .model is used
    if prefix + ".model" != model_path:
        os.replace(prefix + ".model", model_path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(DEFAULT_DIR, "corpus.txt"),
                    help="text corpus to write (default: data/generated/quickstart/corpus.txt)")
    ap.add_argument("--size-mb", type=float, default=3.0, help="approximate size in MB (default 3)")
    ap.add_argument("--seed", type=int, default=1234, help="generator seed (default 1234)")
    ap.add_argument("--jsonl", default=None, help="also write the stories as JSONL {\"text\": ...}")
    ap.add_argument("--tokenizer", nargs="?", const="", default=None, metavar="MODEL",
                    help="also train a SentencePiece model on the corpus (default path: "
                         "tokenizer.model beside --out)")
    ap.add_argument("--vocab-size", type=int, default=2048, help="tokenizer vocabulary (default 2048)")
    args = ap.parse_args()

    out = os.path.abspath(args.out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    stories = list(generate(int(args.size_mb * 1e6), args.seed))
    with open(out, "w", encoding="utf-8", newline="\n") as f:
        f.write("\n\n".join(stories) + "\n")
    print(f"wrote {out}: {len(stories)} stories, {os.path.getsize(out)} bytes")
    if args.jsonl:
        os.makedirs(os.path.dirname(os.path.abspath(args.jsonl)), exist_ok=True)
        with open(args.jsonl, "w", encoding="utf-8", newline="\n") as f:
            for s in stories:
                f.write(json.dumps({"text": s}) + "\n")
        print(f"wrote {args.jsonl}: {len(stories)} records")
    if args.tokenizer is not None:
        model = args.tokenizer or os.path.join(os.path.dirname(out), "tokenizer.model")
        model = os.path.abspath(model)
        os.makedirs(os.path.dirname(model), exist_ok=True)
        train_tokenizer(out, model, args.vocab_size)
        print(f"wrote {model}: SentencePiece BPE, vocab {args.vocab_size}, unk=0 bos=1 eos=2")


if __name__ == "__main__":
    main()
