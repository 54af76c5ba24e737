package classifiers

import "strings"

// The lexical engine sees one text (and one query) at a time, so it has no
// corpus to count document frequencies in. It approximates inverse document
// frequency instead with three bands of general English: function words
// (ignored), the few hundred most frequent content words, the next
// thousand or so, and everything else (rare, hence telling). The lists are
// written from general knowledge of English word frequency, not measured
// on a corpus, and are the same for every caller: an approximation, said as
// one in the README.

const (
	idfCommon   = 0.9 // the most frequent content words: time, make, good
	idfFrequent = 1.6 // frequent but topical: price, team, screen
	idfRare     = 2.4 // anything else: router, refund, quarterback
	idfNumber   = 1.2 // numerals: sometimes telling (error 502), often not
)

// stopwords are function words, auxiliaries and pronouns: never evidence
// of a topic. Negations are here too; the cue scorers read them from the
// terms, which keep stopwords.
var stopwords = setOf(`a about above after again against all am an and any are aren't as at
be because been before being below between both but by can can't cannot could couldn't
did didn't do does doesn't doing don't down during each few for from further had hadn't
has hasn't have haven't having he he'd he'll he's her here here's hers herself him himself
his how how's i i'd i'll i'm i've if in into is isn't it it's its itself let's me more most
mustn't my myself no nor not of off on once only or other ought our ours ourselves out over
own same shan't she she'd she'll she's should shouldn't so some such than that that's the
their theirs them themselves then there there's these they they'd they'll they're they've
this those through to too under until up very was wasn't we we'd we'll we're we've were
weren't what what's when when's where where's which while who who's whom why why's with
won't would wouldn't you you'd you'll you're you've your yours yourself yourselves also
just will shall may might must us via per yet even ever still already ok okay oh yes
s t d ll m re ve im dont doesnt didnt cant wont isnt every whose whether within upon
among across along toward towards since unless although though thus hence`)

// commonWords are roughly the 400 most frequent English content words.
var commonWords = setOf(`time year people way day man thing woman life child world school state
family student group country problem hand part place case week company system program
question work government number night point home water room mother area money story fact
month lot right study book eye job word business issue side kind head house service friend
father power hour game line end member law car city community name president team minute
idea kid body information back parent face others level office door health person art war
history party result change morning reason research girl guy moment air teacher force
education say get make go know take see come think look want give use find tell ask seem
feel try leave call need become keep put mean let begin help show hear play run move like
live believe hold bring happen write provide sit stand lose pay meet include continue set
learn lead understand watch follow stop create speak read allow add spend grow open walk
win offer remember love consider appear buy wait serve die send expect build stay fall cut
reach kill remain suggest raise pass sell require report decide pull good new first last
long great little old big high different small large next early young important public bad
able late hard major better best sure free full special easy clear whole real low short
certain personal open red difficult available likely national black white single several
true general free simple strong possible local past well many much now really never always
often sometimes today tomorrow yesterday back again away around almost enough quite
however perhaps together later soon far less least rather once one two three four
five six seven eight nine ten hundred thousand million second third half thing things
something anything nothing everything someone anyone everyone lot lots way ways yeah
thank thanks please hello hi dear get got going gone made said told asked went came took
seen done given found thought looked used wanted needed tried called worked started`)

// frequentWords are roughly the next thousand or so: common, but already
// point somewhere.
var frequentWords = setOf(`price cost value market bank account card payment order plan
product customer staff support team manager store shop food restaurant hotel travel trip
flight train bus road street town country car phone computer screen internet email message
letter page site website app software data file report document meeting call list form
record paper news article music film movie show picture photo video image song book table
chair bed window wall floor kitchen garden tree flower animal dog cat bird horse fish sun
rain snow weather summer winter spring autumn season wind fire light sound color colour
voice language school class course lesson test exam teacher university college hospital
doctor nurse patient health disease medicine drug pain blood heart skin hair foot leg arm
finger mouth tooth teeth police court law rule right vote election party president minister
leader army war peace church religion god science nature energy oil gas power electricity
machine engine tool box bag bottle glass cup plate knife key lock gift ticket seat price
sale deal tax fee rate interest loan debt profit income salary job career boss worker
employee contract project task problem issue error mistake fault risk danger safety security
quality size weight length speed distance age future past present history period moment
minute second hour weekend holiday birthday party dinner lunch breakfast meal coffee tea
milk bread meat cheese fruit egg sugar salt wine beer drink water ice clothes shirt dress
shoe coat jacket friend partner husband wife son daughter brother sister baby boy girl man
woman men women children kid adult neighbour neighbor guest visitor member player fan
audience crowd public society community village region area land island sea river lake
mountain beach coast field farm park bridge building tower station airport port ship boat
plane space earth moon star planet universe environment climate pollution waste plastic
metal wood stone gold silver steel cotton glass paper plastic model version type kind sort
style design feature option choice chance opportunity success failure goal aim purpose plan
idea opinion view point side reason cause effect result effect answer question reply request
response comment review feedback advice help support service care attention interest
experience knowledge skill ability training practice exercise sport game match race team
score win lose goal ball club league cup final player coach season fan stadium event
meeting conference festival concert show performance theatre theater art artist painting
music band singer song album radio television tv channel series episode film actor star
writer author story novel poem character page chapter word sentence name title address
number phone code password user account login profile setting change update upgrade
download upload install delete remove add edit save share send receive open close start
finish stop wait check test fix repair break broken fail work working problem slow fast
quick easy hard simple difficult cheap expensive rich poor happy sad angry afraid tired sick
ill healthy hungry hot cold warm cool dry wet clean dirty empty full heavy light dark
bright quiet loud soft safe dangerous beautiful pretty ugly nice fine great terrible awful
wonderful amazing excellent perfect poor wrong correct true false ready busy available
possible impossible important necessary serious normal usual strange common main basic
final total whole entire extra average recent modern ancient current daily weekly monthly
annual local foreign international national global private personal official political
economic social financial medical legal natural human physical digital online mobile
wireless electric electronic technical professional special general specific particular
similar different various certain clear obvious simple complex direct free independent
buy sell spend save pay charge cost earn borrow lend owe invest afford waste lose win
travel drive ride fly walk run swim climb jump sit stand lie sleep wake eat drink cook
wash clean dress wear carry hold pick drop throw catch push pull lift turn move stay leave
arrive return visit meet join invite follow lead manage control organise organize plan
prepare decide choose agree disagree accept refuse allow prevent protect support attack
fight argue discuss explain describe mention suggest recommend promise warn complain
apologise apologize thank welcome greet celebrate enjoy like love hate prefer wish hope
fear worry care mind matter notice realise realize recognise recognize remember forget
imagine believe doubt guess wonder understand learn teach study read write draw sing dance
play listen hear watch look see seem appear happen occur exist develop produce increase
reduce improve rise fall grow drop raise cover include contain involve depend belong
compare measure count calculate estimate test prove show indicate represent mean cause`)

var idfBands = func() map[string]float64 {
	m := make(map[string]float64, len(commonWords)+len(frequentWords))
	for w := range frequentWords {
		m[stem(w)] = idfFrequent
	}
	for w := range commonWords {
		m[stem(w)] = idfCommon
	}
	return m
}()

// idf is the approximate inverse document frequency of a stem; stopwords
// are never asked.
func idf(stem string) float64 {
	if v, ok := idfBands[stem]; ok {
		return v
	}
	if stem == "?" {
		return idfFrequent
	}
	if isDigits(stem) {
		return idfNumber
	}
	return idfRare
}

func setOf(words string) map[string]struct{} {
	m := make(map[string]struct{})
	for w := range strings.FieldsSeq(words) {
		m[w] = struct{}{}
	}
	return m
}
