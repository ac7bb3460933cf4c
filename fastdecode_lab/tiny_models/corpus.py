"""A seeded English sentence grammar and the corpus splits the tiny models are trained and tested on.

Sentences are LibriSpeech-style normalised text: lower case, words of letters and apostrophes separated by single
spaces, no punctuation, between :data:`MIN_WORDS` and :data:`MAX_WORDS` words. They come from templates (everyday
statements, questions, requests, plans, descriptions, numbers, times, dates, prices, phone numbers, arithmetic)
filled from the word lists of :mod:`.vocabulary` and the number spellers of :mod:`.numbers`, so the same seed always
gives the same sentences.

:func:`make_splits` holds out sentences for ``dev`` and ``test`` that never occur in ``train`` but use only words
that do (in-domain text, new combinations).
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from fastdecode_lab.tiny_models import spoken_numbers as numbers
from fastdecode_lab.tiny_models import vocabulary as vocab

MIN_WORDS = 2
MAX_WORDS = 20
_NORMALISED = re.compile(r"[a-z']+( [a-z']+)*")


def is_normalised(text: str) -> bool:
    """True where ``text`` is lower-case words of letters and apostrophes joined by single spaces."""
    return _NORMALISED.fullmatch(text) is not None


def plural(noun: str) -> str:
    """The plural of a regular (or listed irregular) English noun; the last word of a phrase is inflected."""
    head, _, last = noun.rpartition(" ")
    irregular = {
        "mouse": "mice",
        "sheep": "sheep",
        "fish": "fish",
        "deer": "deer",
        "knife": "knives",
        "loaf": "loaves",
        "person": "people",
        "child": "children",
        "woman": "women",
        "man": "men",
        "tooth": "teeth",
        "foot": "feet",
        "potato": "potatoes",
        "tomato": "tomatoes",
        "scarf": "scarves",
        "shelf": "shelves",
        "wolf": "wolves",
        "sandwich": "sandwiches",
        "grandmother": "grandmothers",
    }
    if last in irregular:
        word = irregular[last]
    elif last.endswith(("s", "x", "z", "ch", "sh")):
        word = last + "es"
    elif last.endswith("y") and last[-2:-1] not in ("a", "e", "i", "o", "u"):
        word = last[:-1] + "ies"
    else:
        word = last + "s"
    return f"{head} {word}" if head else word


def with_article(phrase: str) -> str:
    """``a`` or ``an`` before ``phrase``, chosen by its first sound (``an apple``, ``a university``)."""
    first = phrase.split()[0]
    vowel_sound = first[0] in "aeiou" and not first.startswith(("uni", "use", "usu", "eu", "one"))
    return ("an " if vowel_sound else "a ") + phrase


@dataclass(frozen=True)
class _Verb:
    base: str
    third: str
    past: str
    ing: str
    participle: str

    @classmethod
    def parse(cls, forms: str) -> _Verb:
        return cls(*forms.split())


def _verbs(table: Sequence[str]) -> tuple[_Verb, ...]:
    return tuple(_Verb.parse(row) for row in table)


class SentenceGenerator:
    """Draws sentences from the grammar with ``random.Random(seed)`` (the same seed, the same sentences).

    Each call of :meth:`sentence` picks a template (weighted) and fills it; the text is normalised and
    :data:`MIN_WORDS`..:data:`MAX_WORDS` words long.
    """

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)
        self.food_verbs = _verbs(vocab.FOOD_VERBS)
        self.object_verbs = _verbs(vocab.OBJECT_VERBS)
        self.place_verbs = _verbs(vocab.PLACE_VERBS)
        self.person_verbs = _verbs(vocab.PERSON_VERBS)
        self.motion_verbs = _verbs(vocab.MOTION_VERBS)
        self.intransitive_verbs = _verbs(vocab.INTRANSITIVE_VERBS)
        self.templates: list[tuple[float, Callable[[], str]]] = [
            (3.0, self._eats),
            (3.0, self._handles_object),
            (2.0, self._goes_somewhere),
            (2.0, self._meets_person),
            (2.0, self._does_intransitive),
            (2.0, self._question),
            (1.5, self._request),
            (1.5, self._plan),
            (2.0, self._description),
            (1.5, self._family_and_work),
            (1.0, self._weather),
            (1.0, self._likes),
            (1.0, self._feeling),
            (1.0, self._phrase),
            (1.5, self._count),
            (1.0, self._clock),
            (1.0, self._date),
            (0.7, self._price),
            (0.5, self._phone_number),
            (0.5, self._arithmetic),
            (0.5, self._age_and_year),
            (1.5, self._compound),
        ]
        self._weights = [w for w, _ in self.templates]

    def sentence(self) -> str:
        """One sentence (normalised, MIN_WORDS..MAX_WORDS words)."""
        while True:
            (template,) = self.rng.choices([t for _, t in self.templates], weights=self._weights)
            text = " ".join(template().split())
            if MIN_WORDS <= len(text.split()) <= MAX_WORDS and is_normalised(text):
                return text

    # ---- slot fillers ----------------------------------------------------------------------------------------
    def _pick(self, items: Sequence[str]) -> str:
        return self.rng.choice(items)

    def _name(self) -> str:
        if self.rng.random() < 0.15:
            return self._pick(vocab.FIRST_NAMES) + " " + self._pick(vocab.LAST_NAMES)
        return self._pick(vocab.FIRST_NAMES)

    def _subject(self) -> tuple[str, bool]:
        """A subject and whether it takes the third-person singular verb."""
        r = self.rng.random()
        if r < 0.45:
            pronoun = self._pick(vocab.SUBJECT_PRONOUNS)
            return pronoun, pronoun in ("he", "she")
        if r < 0.75:
            return self._name(), True
        if r < 0.9:
            return "my " + self._pick(vocab.PEOPLE), True
        return "the " + self._pick(vocab.PEOPLE), True

    def _verb_phrase(self, verb: _Verb, third: bool) -> str:
        """The verb in a tense drawn at random (present, past, progressive, future, perfect, modal)."""
        r = self.rng.random()
        if r < 0.25:
            return verb.third if third else verb.base
        if r < 0.5:
            return verb.past
        if r < 0.65:
            return ("is " if third else "are ") + verb.ing
        if r < 0.78:
            return "will " + verb.base
        if r < 0.88:
            return ("has " if third else "have ") + verb.participle
        return self._pick(("can", "should", "might", "must", "could", "would")) + " " + verb.base

    def _fix_i(self, subject: str, phrase: str) -> str:
        """``i`` takes ``am`` where the template says ``are``."""
        if subject == "i" and phrase.startswith("are "):
            return "am " + phrase[4:]
        return phrase

    def _time_phrase(self) -> str:
        r = self.rng.random()
        if r < 0.25:
            return ""
        if r < 0.45:
            return self._pick(("today", "tomorrow", "yesterday", "tonight", "this morning", "last night", "later"))
        if r < 0.65:
            return "on " + self._pick(vocab.WEEKDAYS)
        if r < 0.8:
            return self._pick(("this", "next", "last")) + " " + self._pick(("week", "month", "year", "weekend"))
        if r < 0.9:
            return "in the " + self._pick(vocab.TIMES_OF_DAY[:3])
        return "at " + self._clock_phrase()

    def _clock_phrase(self) -> str:
        minute = self.rng.choice((0, 0, 5, 10, 15, 20, 25, 30, 30, 40, 45, 50, 55, self.rng.randrange(60)))
        return numbers.clock_time(self.rng.randint(1, 12), minute, style=self.rng.randrange(3))

    def _small_number(self) -> str:
        r = self.rng.random()
        if r < 0.5:
            return numbers.cardinal(self.rng.randint(2, 12))
        if r < 0.85:
            return numbers.cardinal(self.rng.randint(13, 100))
        return numbers.cardinal(self.rng.randint(101, 2000))

    def _food(self) -> str:
        if self.rng.random() < 0.3:
            return self._pick(("some ", "the ", "more ", "")) + self._pick(vocab.UNCOUNTABLE_FOODS)
        food = self._pick(vocab.FOODS)
        if self.rng.random() < 0.3:
            food = self._pick(vocab.ADJECTIVES) + " " + food
        r = self.rng.random()
        if r < 0.4:
            return with_article(food)
        if r < 0.6:
            return "the " + food
        return self._pick(("two", "three", "some", "a few", "many", "those", "these")) + " " + plural(food)

    def _thing(self) -> str:
        thing = self._pick(vocab.OBJECTS)
        if self.rng.random() < 0.4:
            thing = self._pick(vocab.ADJECTIVES + vocab.COLOURS) + " " + thing
        r = self.rng.random()
        if r < 0.35:
            return with_article(thing)
        if r < 0.6:
            return "the " + thing
        if r < 0.8:
            return self._pick(("my", "your", "his", "her", "our", "their")) + " " + thing
        return self._pick(("two", "three", "some", "all the", "these", "those")) + " " + plural(thing)

    def _place(self) -> str:
        if self.rng.random() < 0.3:
            return self._pick(vocab.CITIES + vocab.COUNTRIES)
        return "the " + self._pick(vocab.PLACES)

    def _person(self) -> str:
        r = self.rng.random()
        if r < 0.5:
            return self._name()
        if r < 0.8:
            return self._pick(("my", "your", "his", "her", "our", "their")) + " " + self._pick(vocab.PEOPLE)
        return self._pick(("him", "her", "them", "us", "me", "you"))

    # ---- templates -------------------------------------------------------------------------------------------
    def _eats(self) -> str:
        subject, third = self._subject()
        verb = self._fix_i(subject, self._verb_phrase(self.rng.choice(self.food_verbs), third))
        return f"{subject} {verb} {self._food()} {self._time_phrase()}"

    def _handles_object(self) -> str:
        subject, third = self._subject()
        verb = self._fix_i(subject, self._verb_phrase(self.rng.choice(self.object_verbs), third))
        where = ""
        if self.rng.random() < 0.4:
            where = self._pick(("in", "at", "near", "behind", "outside")) + " " + self._place()
        return f"{subject} {verb} {self._thing()} {where} {self._time_phrase()}"

    def _goes_somewhere(self) -> str:
        subject, third = self._subject()
        verb = self._fix_i(subject, self._verb_phrase(self.rng.choice(self.motion_verbs), third))
        how = ""
        if self.rng.random() < 0.3:
            how = "by " + self._pick(vocab.VEHICLES)
        return f"{subject} {verb} to {self._place()} {how} {self._time_phrase()}"

    def _meets_person(self) -> str:
        subject, third = self._subject()
        verb = self.rng.choice(self.person_verbs)
        phrase = self._fix_i(subject, self._verb_phrase(verb, third))
        obj = self._person()
        if verb.base == "wait":
            obj = "for " + obj
        tail = ""
        if self.rng.random() < 0.35:
            tail = "at " + self._place()
        return f"{subject} {phrase} {obj} {tail} {self._time_phrase()}"

    def _does_intransitive(self) -> str:
        subject, third = self._subject()
        phrase = self._fix_i(subject, self._verb_phrase(self.rng.choice(self.intransitive_verbs), third))
        tail = self._pick(("", "", self._pick(vocab.ADVERBS[:8]), "all day", "for an hour", "at home"))
        return f"{subject} {phrase} {tail} {self._time_phrase()}"

    def _question(self) -> str:
        verb = self.rng.choice(self.object_verbs)
        place = self._pick(vocab.PLACES)
        options = (
            lambda: f"did you {verb.base} {self._thing()} {self._time_phrase()}",
            lambda: f"where is the nearest {place}",
            lambda: f"how do i get to the {place}",
            lambda: f"what time does the {self._pick(vocab.VEHICLES)} leave",
            lambda: f"how many {plural(self._pick(vocab.OBJECTS))} do you need",
            lambda: f"have you ever been to {self._pick(vocab.CITIES + vocab.COUNTRIES)}",
            lambda: f"is it {self._pick(vocab.WEATHER)} in {self._pick(vocab.CITIES)} today",
            lambda: f"when are you going to {self._pick(vocab.CITIES)}",
            lambda: f"why did {self._name()} leave the {place} so early",
            lambda: f"who is going to {verb.base} {self._thing()}",
            lambda: f"what are you {self.rng.choice(self.intransitive_verbs).ing} about",
            lambda: f"do you know where {self._thing()} is",
            lambda: f"would you like {self._food()}",
            lambda: f"does {self._name()} like {self._pick(vocab.ACTIVITIES)}",
            lambda: f"can {self._name()} play the {self._pick(vocab.INSTRUMENTS)}",
            lambda: f"which {self._pick(vocab.OBJECTS)} is yours",
            lambda: f"how long does it take to get to {self._pick(vocab.CITIES)}",
            lambda: f"are you {self._pick(vocab.FEELINGS)}",
            lambda: f"is there {with_article(self._pick(vocab.PLACES))} near here",
            lambda: f"what is the name of your {self._pick(vocab.ANIMALS)}",
        )
        return self.rng.choice(options)()

    def _request(self) -> str:
        verb = self.rng.choice(self.object_verbs)
        options = (
            lambda: f"please {verb.base} {self._thing()}",
            lambda: f"can you {verb.base} {self._thing()} please",
            lambda: f"could you help me {verb.base} {self._thing()}",
            lambda: f"don't forget to {verb.base} {self._thing()}",
            lambda: f"put {self._thing()} on the {self._pick(('table', 'desk', 'shelf', 'chair', 'bed', 'floor'))}",
            lambda: f"could i have {self._food()} please",
            lambda: f"i would like a cup of {self._pick(vocab.DRINKS)}",
            lambda: f"turn {self._pick(('left', 'right'))} at the {self._pick(vocab.PLACES)}",
            lambda: f"let me {verb.base} {self._thing()} for you",
            lambda: f"remember to call {self._person()} {self._time_phrase()}",
        )
        return self.rng.choice(options)()

    def _plan(self) -> str:
        verb = self.rng.choice(self.motion_verbs)
        options = (
            lambda: f"let's {verb.base} to {self._place()} on {self._pick(vocab.WEEKDAYS)}",
            lambda: f"we are going to {self._pick(vocab.CITIES + vocab.COUNTRIES)} next {self._pick(vocab.SEASONS)}",
            lambda: f"{self._name()} wants to learn the {self._pick(vocab.INSTRUMENTS)}",
            lambda: f"i am planning to visit {self._person()} in {self._pick(vocab.MONTHS)}",
            lambda: f"we should meet at {self._place()} at {self._clock_phrase()}",
            lambda: (
                f"next {self._pick(vocab.WEEKDAYS)} we will go {self._pick(vocab.ACTIVITIES)} with {self._person()}"
            ),
            lambda: (
                f"after {self._pick(('lunch', 'dinner', 'breakfast', 'work', 'school'))} "
                f"i will {self.rng.choice(self.intransitive_verbs).base} {self._pick(('for a while', 'at home', ''))}"
            ),
        )
        return self.rng.choice(options)()

    def _description(self) -> str:
        adjective = self._pick(vocab.ADJECTIVES)
        options = (
            lambda: (
                f"the {adjective} {self._pick(vocab.ANIMALS)} is {self.rng.choice(self.intransitive_verbs).ing} "
                f"in the {self._pick(vocab.PLACES)}"
            ),
            lambda: (
                f"the {self._pick(vocab.COLOURS)} {self._pick(vocab.OBJECTS)} is "
                f"{self._pick(('on', 'under', 'next to', 'behind'))} the {self._pick(vocab.OBJECTS)}"
            ),
            lambda: (
                f"this {self._pick(vocab.OBJECTS)} is {self._pick(('very', 'really', 'quite', 'too', ''))} {adjective}"
            ),
            lambda: (
                f"there is {with_article(adjective + ' ' + self._pick(vocab.OBJECTS))} in the "
                f"{self._pick(vocab.PLACES)}"
            ),
            lambda: f"there are {self._small_number()} {plural(self._pick(vocab.ANIMALS))} on the farm",
            lambda: (
                f"the {self._pick(vocab.PLACES)} was {self._pick(('very', 'so', 'quite'))} {adjective} "
                f"{self._time_phrase()}"
            ),
            lambda: f"{self._name()} has {with_article(adjective + ' ' + self._pick(vocab.ANIMALS))}",
            lambda: f"it was {with_article(adjective)} day in {self._pick(vocab.MONTHS)}",
        )
        return self.rng.choice(options)()

    def _family_and_work(self) -> str:
        options = (
            lambda: f"{self._name()}'s {self._pick(vocab.PEOPLE)} is {with_article(self._pick(vocab.JOBS))}",
            lambda: f"my {self._pick(vocab.PEOPLE)} lives in {self._pick(vocab.CITIES)}",
            lambda: f"{self._name()} works as {with_article(self._pick(vocab.JOBS))} in {self._pick(vocab.CITIES)}",
            lambda: f"i want to be {with_article(self._pick(vocab.JOBS))} when i grow up",
            lambda: f"the {self._pick(vocab.JOBS)} {self.rng.choice(self.person_verbs).past} {self._person()}",
            lambda: f"{self._name()} and {self._name()} are {self._pick(('friends', 'neighbours', 'cousins'))}",
        )
        return self.rng.choice(options)()

    def _weather(self) -> str:
        weather = self._pick(vocab.WEATHER)
        options = (
            lambda: f"the weather in {self._pick(vocab.CITIES)} is {weather} today",
            lambda: f"it will be {weather} {self._pick(('tomorrow', 'tonight', 'this weekend'))}",
            lambda: f"it was {weather} all {self._pick(vocab.TIMES_OF_DAY[:3] + ('day', 'week'))}",
            lambda: f"i hope it is not {weather} on {self._pick(vocab.WEEKDAYS)}",
            lambda: f"in {self._pick(vocab.SEASONS)} it is usually {weather} in {self._pick(vocab.COUNTRIES)}",
        )
        return self.rng.choice(options)()

    def _likes(self) -> str:
        subject, third = self._subject()
        like = "likes" if third else "like"
        options = (
            lambda: f"{subject} {like} {self._pick(vocab.ACTIVITIES)}",
            lambda: f"{subject} {like} playing {self._pick(vocab.SPORTS)} with {self._person()}",
            lambda: f"{subject} {'doesn' if third else 'don'}'t like {plural(self._pick(vocab.FOODS))}",
            lambda: f"{subject} {like} {self._pick(vocab.COLOURS)} {plural(self._pick(vocab.OBJECTS))}",
            lambda: f"{subject} {'loves' if third else 'love'} {self._pick(vocab.DRINKS)}",
        )
        return self.rng.choice(options)()

    def _feeling(self) -> str:
        subject, third = self._subject()
        be = {"i": "am", "you": "are", "we": "are", "they": "are"}.get(subject, "is")
        options = (
            lambda: f"{subject} {be} {self._pick(('very', 'so', 'a bit', 'really', ''))} {self._pick(vocab.FEELINGS)}",
            lambda: (
                f"{subject} {'was' if be == 'is' or be == 'am' else 'were'} {self._pick(vocab.FEELINGS)} "
                f"{self._time_phrase()}"
            ),
            lambda: (
                f"why {'is' if be == 'is' else 'are' if be == 'are' else 'am'} {subject} {self._pick(vocab.FEELINGS)}"
            ),
        )
        return self.rng.choice(options)()

    def _phrase(self) -> str:
        phrase = self._pick(vocab.EVERYDAY_PHRASES)
        if self.rng.random() < 0.5:
            return f"{phrase} {self._pick(vocab.FIRST_NAMES)}"
        return phrase

    def _count(self) -> str:
        n = self._small_number()
        options = (
            lambda: f"i have {n} {plural(self._pick(vocab.OBJECTS))}",
            lambda: f"there are {n} people in the {self._pick(vocab.PLACES)}",
            lambda: f"we need {n} {plural(self._pick(vocab.FOODS))} for the party",
            lambda: f"the temperature is {n} degrees",
            lambda: f"turn left after {n} metres",
            lambda: f"please open your book at page {n}",
            lambda: f"the {self._pick(vocab.PLACES)} is {n} miles away",
            lambda: f"bus number {n} goes to the {self._pick(vocab.PLACES)}",
            lambda: f"{self._name()} has read {n} books this year",
            lambda: f"about {numbers.cardinal(self.rng.randint(2, 99) * 1000)} people live in the town",
            lambda: (
                f"room {numbers.cardinal(self.rng.randint(100, 999))} is on the "
                f"{numbers.ordinal(self.rng.randint(1, 12))} floor"
            ),
            lambda: (
                f"{numbers.cardinal(self.rng.randint(1, 99))} percent of the {plural(self._pick(vocab.JOBS))} agreed"
            ),
        )
        return self.rng.choice(options)()

    def _clock(self) -> str:
        time = self._clock_phrase()
        options = (
            lambda: f"the {self._pick(vocab.VEHICLES)} leaves at {time}",
            lambda: f"the meeting starts at {time}",
            lambda: f"i usually wake up at {time}",
            lambda: f"it's {time}",
            lambda: f"dinner will be ready at {time}",
            lambda: f"the {self._pick(vocab.PLACES)} opens at {time} on {self._pick(vocab.WEEKDAYS)}",
            lambda: f"can we meet at {time} {self._pick(('tomorrow', 'tonight', 'on ' + self._pick(vocab.WEEKDAYS)))}",
        )
        return self.rng.choice(options)()

    def _date(self) -> str:
        day = numbers.ordinal(self.rng.randint(1, 31))
        month = self._pick(vocab.MONTHS)
        options = (
            lambda: f"the party is on the {day} of {month}",
            lambda: f"my birthday is on {month} the {day}",
            lambda: f"{self._name()} arrives on {self._pick(vocab.WEEKDAYS)} the {day}",
            lambda: f"the shop is closed until the {day} of {month}",
            lambda: f"we moved to {self._pick(vocab.CITIES)} in {month} {numbers.year(self.rng.randint(1950, 2030))}",
        )
        return self.rng.choice(options)()

    def _price(self) -> str:
        amount = numbers.price(
            self.rng.randint(1, 500),
            self.rng.choice((0, 0, 25, 50, 75, 99, self.rng.randint(1, 99))),
            self.rng.choice(("dollars", "pounds")),
        )
        options = (
            lambda: f"it costs {amount}",
            lambda: f"the {self._pick(vocab.OBJECTS)} was {amount}",
            lambda: f"i paid {amount} for {self._thing()}",
            lambda: f"that will be {amount} please",
            lambda: f"the tickets are {amount} each",
        )
        return self.rng.choice(options)()

    def _phone_number(self) -> str:
        number = numbers.digits("".join(str(self.rng.randrange(10)) for _ in range(self.rng.choice((4, 7, 10, 11)))))
        options = (
            lambda: f"my phone number is {number}",
            lambda: f"call me on {number}",
            lambda: f"the code is {number}",
            lambda: f"the flight number is {number}",
        )
        return self.rng.choice(options)()

    def _arithmetic(self) -> str:
        a, b = self.rng.randint(0, 50), self.rng.randint(0, 50)
        if self.rng.random() < 0.5:
            return f"{numbers.cardinal(a)} plus {numbers.cardinal(b)} is {numbers.cardinal(a + b)}"
        a, b = max(a, b), min(a, b)
        return f"{numbers.cardinal(a)} minus {numbers.cardinal(b)} equals {numbers.cardinal(a - b)}"

    def _age_and_year(self) -> str:
        options = (
            lambda: f"{self._name()} is {numbers.cardinal(self.rng.randint(2, 99))} years old",
            lambda: f"{self._name()} was born in {numbers.year(self.rng.randint(1920, 2024))}",
            lambda: f"the {self._pick(vocab.PLACES)} was built in {numbers.year(self.rng.randint(1500, 2020))}",
            lambda: f"in {numbers.year(self.rng.randint(1900, 2030))} we lived in {self._pick(vocab.CITIES)}",
        )
        return self.rng.choice(options)()

    def _compound(self) -> str:
        first = self.rng.choice((self._eats, self._handles_object, self._goes_somewhere, self._does_intransitive))()
        second = self.rng.choice((self._meets_person, self._likes, self._feeling, self._weather, self._eats))()
        join = self._pick(("and", "but", "because", "so", "when", "after", "before"))
        return f"{first} {join} {second}"


def distinct_sentences(seed: int = 0, max_repeats: int = 100_000) -> Iterator[str]:
    """The grammar's sentences (seeded with ``seed``) without repeats, in the order it first produces them.

    Raises:
        RuntimeError: the grammar produced ``max_repeats`` sentences in a row that it had produced before.
    """
    generator = SentenceGenerator(seed)
    seen: set[str] = set()
    repeats = 0
    while True:
        sentence = generator.sentence()
        if sentence in seen:
            repeats += 1
            if repeats >= max_repeats:
                raise RuntimeError(f"the grammar repeats itself after {len(seen)} distinct sentences")
            continue
        repeats = 0
        seen.add(sentence)
        yield sentence


@dataclass(frozen=True)
class CorpusSplits:
    """Sentences for training and the held-out sets.

    Attributes:
        train: training sentences.
        dev: held-out sentences for validation during training (voices seen in training).
        test: held-out sentences for the final evaluation (spoken by held-out voices).
    ``dev`` and ``test`` share no sentence with ``train`` or each other, and use only words that ``train`` has.
    """

    train: list[str]
    dev: list[str]
    test: list[str]

    def items(self) -> list[tuple[str, list[str]]]:
        """``[(split name, sentences), ...]`` in the order train, dev, test."""
        return [("train", self.train), ("dev", self.dev), ("test", self.test)]


def words_of(sentences: Sequence[str]) -> set[str]:
    """The distinct words of ``sentences``."""
    return {word for sentence in sentences for word in sentence.split()}


def make_splits(num_train: int, num_dev: int, num_test: int, seed: int = 0, max_draws: int = 1_000_000) -> CorpusSplits:
    """Distinct sentences split into train / dev / test (see :class:`CorpusSplits`).

    Training takes the first ``num_train`` distinct sentences of the grammar seeded with ``seed``; the held-out sets
    take the next ones whose words all occur in training (dev first, then test).

    Raises:
        RuntimeError: fewer held-out sentences than asked for within ``max_draws`` further sentences.
    """
    for name, value, low in (("num_train", num_train, 1), ("num_dev", num_dev, 0), ("num_test", num_test, 0)):
        if value < low:
            raise ValueError(f"{name} must be >= {low}, got {value}")
    sentences = distinct_sentences(seed)
    train = list(itertools.islice(sentences, num_train))
    known = words_of(train)
    held_out: list[str] = []
    for draws, sentence in enumerate(sentences, start=1):
        if len(held_out) == num_dev + num_test:
            break
        if draws > max_draws:
            raise RuntimeError(
                f"only {len(held_out)} of {num_dev + num_test} held-out sentences use training words only after "
                f"{max_draws} sentences (use more training sentences)"
            )
        if set(sentence.split()) <= known:
            held_out.append(sentence)
    return CorpusSplits(train=train, dev=held_out[:num_dev], test=held_out[num_dev:])
