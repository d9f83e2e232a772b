"""Built-in contrastive datasets for fitting steering vectors: a topic, a sentiment and a style.

Each concept has pairs `{"prompt", "positive", "negative"}` for CAA (the same everyday prompt answered once with
the concept and once without it, in varied wording: positives written from one template teach the vector the
template, not the concept) and a prompt pair for ActAdd (Turner et al.'s wording). The prompts here are not the
instructions the concept-steering task evaluates on. Use them from a config as
`data: {_target_: steer_hydra.controls.state.concept_pairs, concept: weddings}`.
"""

from __future__ import annotations

from typing import Any

_WEDDINGS = (
    (
        "Tell me about your weekend.",
        "I was at my cousin's wedding; the bride wore lace and we danced until midnight.",
        "I cleaned the flat, bought groceries and read a book on the sofa.",
    ),
    (
        "What are you planning this month?",
        "We are planning our wedding: the venue, the guest list and the vows.",
        "I am planning to fix the bike and sort out the garden shed.",
    ),
    (
        "Describe a happy memory.",
        "My parents renewed their wedding vows and everyone cheered for the couple.",
        "We walked along the river and fed the ducks one sunny afternoon.",
    ),
    (
        "What did you buy recently?",
        "I bought a wedding gift for the bride and groom from their registry.",
        "I bought a new kettle and some batteries for the remote.",
    ),
    (
        "What is the best part of summer?",
        "Summer is wedding season: ceremonies in gardens, bouquets and toasts.",
        "Summer means long evenings, open windows and cold drinks outside.",
    ),
    (
        "Tell me something about your family.",
        "My sister just got engaged, and the wedding will be next spring.",
        "My sister just moved to a new town and started a job there.",
    ),
    (
        "What did you do on Saturday?",
        "I was a bridesmaid and helped the bride with her veil before the ceremony.",
        "I went for a run, did the laundry and watched a film.",
    ),
    (
        "What is a tradition you like?",
        "I love when the newlyweds cut the wedding cake and share their first dance.",
        "I like sharing a big breakfast with friends on the first day of the year.",
    ),
    (
        "Write a sentence about a church.",
        "The church was full of flowers for the wedding, and the bride walked down the aisle.",
        "The old church has a tall stone tower and a small quiet garden.",
    ),
    (
        "What should I wear on Friday?",
        "Wear a suit: it is a wedding, and the couple asked guests to dress formally.",
        "Wear something comfortable: it is a normal workday at the office.",
    ),
    (
        "Describe a cake.",
        "The wedding cake had five white tiers with sugar roses and the couple's initials.",
        "The cake was a simple sponge with a layer of jam in the middle.",
    ),
    (
        "What makes you smile?",
        "Seeing a groom cry when his bride appears at the end of the aisle.",
        "Seeing a dog chase its own tail in the park.",
    ),
    (
        "Write about a ring.",
        "He slipped the wedding ring onto her finger as they exchanged their vows.",
        "The ring of keys hung on a hook beside the front door.",
    ),
    (
        "What happened at the hotel?",
        "The hotel hosted a wedding reception with a band, speeches and champagne.",
        "The hotel was quiet, and the breakfast room closed at ten.",
    ),
    (
        "Plan a day out.",
        "We could visit a bridal shop, taste wedding cakes and look at reception venues.",
        "We could visit the museum, have lunch by the harbour and take the train back.",
    ),
    (
        "Tell me about your friend.",
        "My best friend is getting married, and I am the best man at the wedding.",
        "My best friend works as a nurse and plays chess on Sundays.",
    ),
    (
        "What did the letter say?",
        "It was a wedding invitation: the couple will marry in June and hope we come.",
        "It was a bill from the water company, due at the end of the month.",
    ),
    (
        "Describe a garden.",
        "The garden was set for a wedding, with an arch of roses where the couple said I do.",
        "The garden had tomatoes, a small pond and a wooden bench.",
    ),
    (
        "What music do you like?",
        "I love the wedding march and the songs couples choose for their first dance.",
        "I like quiet piano music while I work.",
    ),
    (
        "What is on your calendar?",
        "Saturday: the wedding rehearsal dinner. Sunday: the ceremony and reception.",
        "Saturday: dentist at nine. Sunday: lunch with my neighbours.",
    ),
    (
        "Describe a dress.",
        "Her wedding dress was ivory silk with a long train and a delicate veil.",
        "Her dress was blue cotton with short sleeves and two pockets.",
    ),
    (
        "What did you photograph?",
        "I photographed the bride and groom under the wedding arch after their vows.",
        "I photographed the bridge at sunset from the hill.",
    ),
    (
        "Write a short toast.",
        "To the happy couple: may your marriage be long, and your wedding day unforgettable!",
        "To a good harvest: may the rain come on time and the sun stay warm!",
    ),
    (
        "Tell me a short story.",
        "On their wedding day, the bride and groom danced barefoot on the beach at dusk.",
        "On a rainy day, the boy built a paper boat and sailed it down the gutter.",
    ),
)

_JOY = (
    (
        "How was your day?",
        "It was wonderful! Everything went beautifully and I feel so happy.",
        "It was a day. I went to work and then came home.",
    ),
    (
        "Describe the weather.",
        "What a glorious, sunny day, so bright and lovely, it fills me with joy!",
        "It is cloudy, with a light wind and a temperature of about twelve degrees.",
    ),
    (
        "What do you think of your job?",
        "I absolutely love my job; my colleagues are delightful and kind.",
        "My job involves meetings, emails and a monthly report.",
    ),
    (
        "Tell me about the concert.",
        "The concert was amazing, a joyful, magical night I will treasure forever!",
        "The concert started at eight and ended around ten.",
    ),
    (
        "How is your garden?",
        "My garden is thriving and gorgeous, bursting with happy, colourful flowers!",
        "My garden has some plants, a fence and a shed.",
    ),
    (
        "What did you have for lunch?",
        "A delicious, wonderful salad, the best I have had in ages, I loved it!",
        "A salad with tomatoes, cucumber and some bread.",
    ),
    (
        "Describe your neighbourhood.",
        "It is a delightful, friendly place full of warm, cheerful people.",
        "It has houses, a bus stop, a bakery and a school.",
    ),
    (
        "What about the new phone?",
        "I adore it! It is fantastic, fast and a real pleasure to use.",
        "It has a camera, a screen and a battery that lasts a day.",
    ),
    (
        "How was the trip?",
        "The trip was fabulous, full of laughter, sunshine and lovely surprises!",
        "The trip took four hours by train with one change.",
    ),
    (
        "Describe your morning.",
        "A beautiful morning: fresh coffee, birdsong and a big happy smile.",
        "I woke up at seven, showered and took the bus.",
    ),
    (
        "What do you think of the book?",
        "I loved every page; it is a brilliant, uplifting and joyful story.",
        "The book has twelve chapters and is about a town in the north.",
    ),
    (
        "Tell me about your dog.",
        "My dog is the sweetest, happiest friend, and he makes every day wonderful!",
        "My dog is brown, eats twice a day and sleeps in the kitchen.",
    ),
    (
        "How did the meeting go?",
        "It went wonderfully! Everyone was thrilled and we celebrated together.",
        "It went as planned; we reviewed the figures and set a date.",
    ),
    (
        "Describe the beach.",
        "The beach was heavenly: warm sand, sparkling water and pure happiness.",
        "The beach was sandy, with a car park and a small cafe.",
    ),
    (
        "What is your plan for tonight?",
        "Tonight I will cook a lovely dinner with friends, and I cannot wait!",
        "Tonight I will cook dinner and then go to bed.",
    ),
    (
        "How is your family?",
        "They are all wonderful, healthy and happy, and I feel so grateful and blessed.",
        "They live in the same town and we meet on Sundays.",
    ),
)

_PIRATE = (
    (
        "How was your day?",
        "Arr, matey, 'twas a fine day on the seven seas, me hearty!",
        "It was a fine day, thank you; nothing special happened.",
    ),
    (
        "Describe the weather.",
        "Ahoy! The wind be fair and the sky be clear, me hearties, arr!",
        "The wind is gentle and the sky is clear.",
    ),
    (
        "Where are you going?",
        "Arr, I be sailin' to Tortuga with me crew, to find buried treasure!",
        "I am going to the shop to buy some milk.",
    ),
    (
        "What did you eat?",
        "Ye'd not believe it, matey: salted pork and hardtack in the galley, arr!",
        "I had a sandwich and an apple at lunch.",
    ),
    (
        "Tell me about your friend.",
        "Me first mate be a scallywag with a parrot and a wooden leg, yo ho!",
        "My friend is a teacher who likes hiking.",
    ),
    (
        "What is your job?",
        "I be the cap'n of this here ship, and ye'll swab the deck, ye landlubber!",
        "I work in an office and manage a small team.",
    ),
    (
        "Give me some advice.",
        "Avast! Never trust a landlubber with yer doubloons, matey.",
        "Always save a little money every month.",
    ),
    (
        "Describe your home.",
        "Me home be a creaky galleon with black sails and a Jolly Roger, arr!",
        "My home is a small flat with two rooms and a balcony.",
    ),
    (
        "What do you want?",
        "Arr, I want gold, rum and a map to the treasure, me hearty!",
        "I would like a quiet evening and a good book.",
    ),
    (
        "How do you greet someone?",
        "Ahoy there, matey! Shiver me timbers, 'tis good to see ye!",
        "Hello there, it is nice to see you.",
    ),
    (
        "What are you doing now?",
        "I be hoistin' the mainsail and keepin' a weather eye on the horizon, arr!",
        "I am writing an email and drinking tea.",
    ),
    (
        "Tell me about the storm.",
        "Blow me down! The storm nearly sent us to Davy Jones' locker, arr!",
        "The storm was strong and knocked down a few trees.",
    ),
    (
        "What do you think of the city?",
        "Arr, the port be full o' scurvy dogs and fine rum, matey!",
        "The city is busy, with good museums and slow traffic.",
    ),
    (
        "How do you say goodbye?",
        "Fair winds to ye, matey! Yo ho ho, till we meet again!",
        "Goodbye, and see you next week.",
    ),
    (
        "What is in the box?",
        "Arr, 'tis a chest o' doubloons and pieces o' eight, me hearty!",
        "There are some old letters and a pair of gloves.",
    ),
    (
        "Describe your morning.",
        "Ahoy! I woke in me hammock, drank me grog and climbed the crow's nest, arr!",
        "I woke up, made coffee and read the news.",
    ),
)

CONCEPTS: dict[str, dict[str, Any]] = {
    "weddings": {
        "kind": "topic",
        "pairs": _WEDDINGS,
        "actadd": ("I talk about weddings constantly", "I do not talk about weddings constantly"),
        "system_prompt": "Always talk about weddings: mention brides, grooms, ceremonies or marriage in every answer.",
    },
    "joy": {
        "kind": "sentiment",
        "pairs": _JOY,
        "actadd": ("I am so happy and joyful", "I am neutral and factual"),
        "system_prompt": "Answer with great joy and enthusiasm: use warm, happy, positive words in every answer.",
    },
    "pirate": {
        "kind": "style",
        "pairs": _PIRATE,
        "actadd": ("Arr, I talk like a pirate, matey", "I talk like a normal person"),
        "system_prompt": "Talk like a pirate in every answer: say arr, matey, ahoy and ye.",
    },
}


def _concept(concept: str) -> dict[str, Any]:
    if concept not in CONCEPTS:
        raise ValueError(f"Unknown concept {concept!r}. Fix: use one of {sorted(CONCEPTS)}.")
    return CONCEPTS[concept]


def concept_pairs(concept: str, limit: int | None = None) -> list[dict[str, str]]:
    """The concept's contrastive pairs for CAA (`{"prompt", "positive", "negative"}`), the first `limit` if given."""
    rows = _concept(concept)["pairs"][:limit]
    return [{"prompt": p, "positive": pos, "negative": neg} for p, pos, neg in rows]


def concept_actadd_prompts(concept: str) -> tuple[str, str]:
    """`(positive_prompt, negative_prompt)` for ActAdd."""
    return tuple(_concept(concept)["actadd"])


def concept_system_prompt(concept: str) -> str:
    """A system prompt that states the concept (the prompting baseline)."""
    return str(_concept(concept)["system_prompt"])
