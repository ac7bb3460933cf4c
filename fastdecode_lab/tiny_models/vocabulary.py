"""The word lists of the training-text grammar (:mod:`.corpus`): common English words by role.

Written for this repository (Apache-2.0, as the rest of it): lower case, letters and apostrophes only, one word per
entry except where an entry is a fixed phrase. Verbs list their forms as ``base third-person past -ing participle``.
"""

from __future__ import annotations


def _words(text: str) -> tuple[str, ...]:
    """The whitespace-separated entries of ``text`` in order, without repeats; ``_`` joins the words of one entry."""
    return tuple(dict.fromkeys(w.replace("_", " ") for w in text.split()))


def _lines(text: str) -> tuple[str, ...]:
    """The non-empty lines of ``text``."""
    return tuple(line.strip() for line in text.strip().splitlines() if line.strip())


FIRST_NAMES = _words("""
james mary john patricia robert jennifer michael linda william elizabeth david barbara richard susan joseph jessica
thomas sarah charles karen christopher lisa daniel nancy matthew betty anthony margaret mark sandra donald ashley
steven kimberly paul emily andrew donna joshua michelle kenneth carol kevin amanda brian dorothy george melissa
timothy deborah ronald stephanie edward rebecca jason sharon jeffrey laura ryan cynthia jacob kathleen gary amy
nicholas angela eric shirley jonathan anna stephen brenda larry pamela justin emma scott nicole brandon helen
benjamin samantha samuel katherine gregory christine alexander debra frank rachel patrick carolyn raymond janet jack
catherine dennis maria jerry heather tyler diane aaron ruth jose julie adam olivia henry joyce nathan virginia
douglas victoria zachary kelly peter lauren kyle christina noah joan ethan evelyn jeremy judith walter megan
christian andrea keith cheryl roger hannah terry jacqueline austin martha sean gloria gerald teresa carl ann harold
sara dylan madison arthur frances lawrence kathryn jordan janice jesse jean bryan abigail billy alice bruce judy
gabriel sophia joe grace logan denise albert amber alan marilyn juan danielle wayne beverly elijah isabella randy
theresa roy diana vincent natalie ralph brittany eugene charlotte russell marie bobby kayla mason alexis philip lori
louis lucy oliver harry leo oscar freddie archie theo arthur alfie poppy ella mia ava isla ivy rosie daisy lily
""")

LAST_NAMES = _words("""
smith johnson williams brown jones garcia miller davis rodriguez martinez hernandez lopez gonzalez wilson anderson
taylor moore jackson martin lee perez thompson white harris sanchez clark ramirez lewis robinson walker young allen
king wright scott torres nguyen hill flores green adams nelson baker hall rivera campbell mitchell carter roberts
gomez phillips evans turner diaz parker cruz edwards collins reyes stewart morris morales murphy cook rogers ortiz
morgan cooper peterson bailey reed kelly howard ramos kim cox ward richardson watson brooks chavez wood bennett gray
mendoza ruiz hughes price alvarez castillo sanders patel myers long ross foster jimenez powell jenkins perry russell
sullivan bell coleman butler henderson barnes fisher vasquez simmons graham marshall owens harrison gibson wallace
""")

CITIES = _words("""
london paris berlin madrid rome tokyo boston chicago denver dallas houston seattle portland austin phoenix atlanta
miami detroit toronto vancouver montreal dublin edinburgh glasgow manchester liverpool bristol oxford cambridge
sydney melbourne auckland lisbon vienna prague warsaw athens cairo nairobi lagos mumbai delhi beijing shanghai seoul
bangkok singapore jakarta manila moscow oslo stockholm helsinki copenhagen amsterdam brussels zurich geneva munich
hamburg milan naples venice florence barcelona seville valencia lyon marseille nice budapest krakow istanbul dubai
boston baltimore philadelphia pittsburgh cleveland memphis nashville orlando tampa sacramento oakland honolulu
anchorage calgary ottawa quebec halifax belfast cardiff leeds sheffield newcastle brighton york bath
""")

COUNTRIES = _words("""
france germany spain italy japan china india canada mexico brazil egypt kenya australia ireland scotland england
wales norway sweden finland denmark poland greece turkey russia peru chile argentina portugal austria switzerland
belgium iceland morocco nigeria ghana vietnam thailand korea indonesia malaysia pakistan colombia cuba jamaica
""")

# singular nouns, grouped by what a sentence can do with them; plurals come from :func:`.corpus.plural`
FOODS = _words("""
apple banana orange lemon peach pear plum cherry grape strawberry melon tomato potato carrot onion pepper cucumber
lettuce cabbage mushroom sandwich burger pizza salad soup cake cookie biscuit pie muffin pancake waffle egg sausage
steak chicken fish noodle pasta bagel donut pretzel cupcake omelette taco burrito curry stew pudding tart
""")

UNCOUNTABLE_FOODS = _words("""
bread rice cheese butter jam honey cereal toast chocolate ice_cream popcorn yogurt pasta soup salad fruit meat
""")

DRINKS = _words("""
coffee tea water milk juice lemonade soda cocoa
""")

OBJECTS = _words("""
book pen pencil phone laptop computer key wallet bag box bottle cup mug glass plate bowl spoon fork knife chair table
lamp clock watch camera radio letter card ticket map umbrella hat coat jacket shirt sweater scarf glove shoe boot sock
ring necklace picture painting mirror pillow blanket towel basket bucket ladder hammer brush broom candle envelope
notebook magazine newspaper guitar piano violin drum ball kite toy puzzle candle bicycle suitcase backpack window door
desk shelf drawer sofa bed fridge oven kettle toaster stove bottle jar can tray screen keyboard mouse printer charger
battery cable helmet tent torch rope bench fence gate
""")

PLACES = _words("""
park library school office station airport museum bank shop market supermarket bakery hospital pharmacy cinema
theatre restaurant cafe hotel church garden kitchen bedroom bathroom garage beach river lake forest mountain village
city farm zoo stadium gym pool harbour bridge street square corner office factory university college campus castle
island valley hill field playground bookshop post_office bus_stop car_park train_station
""")

ANIMALS = _words("""
dog cat horse cow pig sheep goat rabbit mouse bird duck chicken owl eagle fox wolf bear lion tiger elephant monkey
giraffe zebra deer frog snake turtle fish whale dolphin shark bee spider butterfly squirrel hamster parrot penguin
""")

VEHICLES = _words("""
car bus train taxi bike boat ship plane truck van tram ferry motorbike scooter
""")

PEOPLE = _words("""
teacher doctor nurse driver farmer pilot baker chef waiter student manager neighbour friend brother sister mother
father uncle aunt cousin grandmother grandfather son daughter boss doctor dentist lawyer engineer artist singer
player captain officer postman cleaner builder gardener writer reporter scientist police_officer customer visitor
""")

JOBS = _words("""
teacher doctor nurse driver farmer pilot baker chef waiter student manager dentist lawyer engineer artist singer
writer reporter scientist builder gardener cleaner mechanic plumber electrician pharmacist librarian photographer
""")

ADJECTIVES = _words("""
big small large little long short tall old new young good bad great nice lovely happy sad angry tired hungry
thirsty busy quiet loud clean dirty cold hot warm cool wet dry heavy light dark bright easy hard soft strong weak
fast slow early late rich poor cheap expensive beautiful ugly funny serious strange simple friendly kind brave
careful lucky famous favourite empty full fresh ready safe dangerous important interesting boring wonderful terrible
perfect quick huge tiny round square sharp smooth sweet sour bitter salty spicy healthy sick free open closed
""")

COLOURS = _words("""
red blue green yellow orange purple pink brown black white grey silver golden
""")

ADVERBS = _words("""
quickly slowly carefully quietly loudly easily happily suddenly finally always never often sometimes usually really
very almost already again soon today tomorrow yesterday tonight early late together outside inside upstairs
downstairs everywhere here there now then still just probably certainly
""")

WEEKDAYS = _words("monday tuesday wednesday thursday friday saturday sunday")

MONTHS = _words("january february march april may june july august september october november december")

SEASONS = _words("spring summer autumn winter")

TIMES_OF_DAY = _words("morning afternoon evening night")

WEATHER = _words("""
sunny rainy cloudy windy foggy snowy stormy warm cold hot freezing humid
""")

SUBJECT_PRONOUNS = _words("i you we they he she")

# verbs: base third past ing participle
FOOD_VERBS = _lines("""
eat eats ate eating eaten
cook cooks cooked cooking cooked
buy buys bought buying bought
want wants wanted wanting wanted
like likes liked liking liked
love loves loved loving loved
make makes made making made
order orders ordered ordering ordered
bring brings brought bringing brought
share shares shared sharing shared
taste tastes tasted tasting tasted
""")

OBJECT_VERBS = _lines("""
take takes took taking taken
find finds found finding found
lose loses lost losing lost
carry carries carried carrying carried
open opens opened opening opened
close closes closed closing closed
move moves moved moving moved
clean cleans cleaned cleaning cleaned
fix fixes fixed fixing fixed
break breaks broke breaking broken
drop drops dropped dropping dropped
hold holds held holding held
keep keeps kept keeping kept
sell sells sold selling sold
borrow borrows borrowed borrowing borrowed
lend lends lent lending lent
need needs needed needing needed
use uses used using used
check checks checked checking checked
wash washes washed washing washed
paint paints painted painting painted
send sends sent sending sent
give gives gave giving given
get gets got getting got
put puts put putting put
hide hides hid hiding hidden
pick picks picked picking picked
""")

PLACE_VERBS = _lines("""
visit visits visited visiting visited
leave leaves left leaving left
find finds found finding found
love loves loved loving loved
reach reaches reached reaching reached
pass passes passed passing passed
clean cleans cleaned cleaning cleaned
explore explores explored exploring explored
""")

PERSON_VERBS = _lines("""
meet meets met meeting met
call calls called calling called
help helps helped helping helped
ask asks asked asking asked
tell tells told telling told
see sees saw seeing seen
know knows knew knowing known
thank thanks thanked thanking thanked
visit visits visited visiting visited
follow follows followed following followed
invite invites invited inviting invited
remember remembers remembered remembering remembered
wait waits waited waiting waited
phone phones phoned phoning phoned
email emails emailed emailing emailed
miss misses missed missing missed
teach teaches taught teaching taught
pay pays paid paying paid
""")

MOTION_VERBS = _lines("""
go goes went going gone
walk walks walked walking walked
run runs ran running run
drive drives drove driving driven
fly flies flew flying flown
travel travels travelled travelling travelled
come comes came coming come
move moves moved moving moved
cycle cycles cycled cycling cycled
return returns returned returning returned
hurry hurries hurried hurrying hurried
""")

INTRANSITIVE_VERBS = _lines("""
sleep sleeps slept sleeping slept
laugh laughs laughed laughing laughed
smile smiles smiled smiling smiled
cry cries cried crying cried
sing sings sang singing sung
dance dances danced dancing danced
swim swims swam swimming swum
work works worked working worked
study studies studied studying studied
rest rests rested resting rested
wait waits waited waiting waited
arrive arrives arrived arriving arrived
shout shouts shouted shouting shouted
listen listens listened listening listened
win wins won winning won
play plays played playing played
read reads read reading read
write writes wrote writing written
cook cooks cooked cooking cooked
relax relaxes relaxed relaxing relaxed
""")

ACTIVITIES = _words("""
reading swimming cooking running walking dancing singing painting drawing fishing shopping cycling skiing hiking
gardening baking writing sailing climbing camping travelling knitting jogging studying
""")

SPORTS = _words("""
football tennis golf basketball baseball hockey cricket rugby volleyball chess cards badminton
""")

INSTRUMENTS = _words("piano guitar violin drums flute trumpet cello harp")

FEELINGS = _words("""
happy sad tired hungry thirsty angry excited nervous bored worried scared busy sleepy ready sorry glad proud
""")

EVERYDAY_PHRASES = _lines("""
good morning
good afternoon
good evening
good night
thank you very much
thanks a lot
you're welcome
excuse me
i'm sorry
no problem
see you later
see you soon
see you tomorrow
have a nice day
have a good weekend
nice to meet you
how are you
how are you doing
i'm fine thanks
not too bad
what's up
long time no see
take care
good luck
well done
happy birthday
merry christmas
happy new year
welcome back
come on in
please sit down
hold on a second
just a moment please
let me think
i don't know
i'm not sure
that sounds good
that's a great idea
of course
no thank you
yes please
i agree
i don't think so
never mind
don't worry about it
it doesn't matter
what a surprise
how lovely
that's too bad
what time is it
where are you going
what are you doing
how much is it
can you help me
i need some help
call me later
i'll be right back
let's go
wait for me
be careful
hurry up
slow down
keep going
stop right there
""")
