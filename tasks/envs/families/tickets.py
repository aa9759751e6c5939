"""A support help desk: agents in teams, customers, tickets and their comments behind lookup, triage
and (distractor) help-desk tools.

Knobs by level (see `common`): level 1 closes a ticket named by its number (2 calls, 1 distractor
tool); level 2 makes a company's ticket, named by its topic, urgent and gives it to the agent of the
right team with the fewest open tickets (company -> customer -> ticket, team load: 5 calls, 3
distractors); level 3 merges a customer's duplicate ticket into the older one, hands the older one to
the agent of the newer one and leaves the customer a note, while another customer has the same name
and a ticket on the same topic (the company disambiguates; 6 calls, 6 distractors). Expected rows are
computed here in Python from the generated data.
"""

from __future__ import annotations

import random

from ..tools.code_text import statements
from .tool_base import ID, UPDATE_CUSTOMER_EMAIL, S, Scenario, Store, ToolFamily, after, call, email, people, tool
from .tool_code import tickets as code

COMPANIES = ["Acme Foods", "Birch Legal", "Cobalt Labs", "Dune Travel", "Elm Clinics", "Fjord Media", "Granite Bank",
             "Harbor Freight Co", "Iris Schools", "Juniper Hotels", "Kestrel Air", "Lumen Energy"]
SUBJECTS = {
    "billing": ["Charged twice for the March invoice", "Refund not received yet", "VAT number missing on invoice",
                "Card declined at renewal", "Wrong currency on our bill"],
    "technical": ["Export to CSV times out", "Login loop after password reset", "Webhooks stopped firing",
                  "Dashboard shows stale data", "API returns 500 on file upload"],
    "accounts": ["Please add a second admin", "Change the company name on our account", "Close our old workspace",
                 "Question about SSO setup", "Move seats to another team"],
}
PRIORITIES = ["low", "normal", "high", "urgent"]

DOMAIN_HELPERS = statements(code, "_ticket", "_live")

LIBRARY = [
    tool(code.search_customers, "Customers whose name, company or e-mail contains the text.",
         {"text": {"type": "string", "minLength": 2}}),
    tool(code.list_tickets, "Tickets of a customer and/or with a status: id, subject, status, priority, created.",
         {"customer_id": ID, "status": {"type": "string", "enum": ["open", "pending", "closed", "merged"]}}, []),
    tool(code.get_ticket, "One ticket with its customer, assignee and comments.", {"ticket_id": ID}),
    tool(code.list_agents, "Support agents (optionally of one team) with how many open or pending tickets each has.",
         {"team": {"type": "string", "enum": sorted(SUBJECTS)}}, []),
    tool(code.assign_ticket, "Give an open or pending ticket to an agent.", {"ticket_id": ID, "agent_id": ID}),
    tool(code.set_priority, "Set an open or pending ticket's priority.",
         {"ticket_id": ID, "priority": {"type": "string", "enum": PRIORITIES}}),
    tool(code.set_status, "Set a ticket's status to open, pending or closed.",
         {"ticket_id": ID, "status": {"type": "string", "enum": ["open", "pending", "closed"]}}),
    tool(code.add_comment, "Add a comment from support to a ticket (the customer sees it).",
         {"ticket_id": ID, "body": S}),
    tool(code.merge_tickets, "Merge a duplicate ticket (source) into another ticket of the same customer (target).",
         {"source_id": ID, "target_id": ID}),
    tool(code.get_sla_policy, "Response and resolution targets for a priority.",
         {"priority": {"type": "string", "enum": PRIORITIES}}),
    tool(code.list_macros, "Canned replies agents can paste into comments."),
    tool(code.escalate_to_engineering, "Open an engineering escalation for a ticket, with a summary.",
         {"ticket_id": ID, "summary": S}),
    UPDATE_CUSTOMER_EMAIL,
    tool(code.create_ticket, "Open a new ticket for a customer.", {"customer_id": ID, "subject": S}),
    tool(code.ticket_stats, "How many tickets have each status."),
]


class Tickets(ToolFamily):
    name = "tickets"
    description = "support help-desk tools: find customers and tickets, triage, assign, merge (end state checked)"

    def fill(self, s: Store, rng: random.Random, customers: int, agents: int) -> None:
        per_team = agents // 3  # one team per subject
        names = people(rng, customers + 3 * per_team)
        s.add("agents", "id INTEGER PRIMARY KEY, name TEXT NOT NULL, team TEXT NOT NULL",
              [[i + 1, n, sorted(SUBJECTS)[i // per_team]] for i, n in enumerate(names[customers:])])
        s.add("customers", "id INTEGER PRIMARY KEY, name TEXT NOT NULL, company TEXT NOT NULL, email TEXT NOT NULL",
              [[i, n, co, email(n, rng.randint(1, 99))]
               for i, (n, co) in enumerate(zip(names[:customers], rng.choices(COMPANIES, k=customers)), 1)])
        s.add("tickets", "id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id), "
                         "subject TEXT NOT NULL, status TEXT NOT NULL, priority TEXT NOT NULL, "
                         "assignee_id INTEGER REFERENCES agents(id), created TEXT NOT NULL, merged_into INTEGER")
        s.add("comments", "id INTEGER PRIMARY KEY, ticket_id INTEGER NOT NULL REFERENCES tickets(id), "
                          "author TEXT NOT NULL, body TEXT NOT NULL")
        s.add("escalations", "id INTEGER PRIMARY KEY, ticket_id INTEGER NOT NULL, summary TEXT NOT NULL")
        for c in self.records_per_owner(rng, customers):
            Tickets._ticket(s, rng, c, rng.choices(["open", "pending", "closed"], [3, 2, 3])[0])

    @staticmethod
    def _ticket(s: Store, rng: random.Random, customer: int, status: str, subject: str | None = None,
                assignee: int | None | str = "random", created: str | None = None) -> int:
        team = rng.choice(sorted(SUBJECTS))
        subject = subject or rng.choice(SUBJECTS[team])
        agents = [a[0] for a in s["agents"].rows if subject in SUBJECTS[a[2]]]
        tid = 3001 + len(s["tickets"].rows)
        created = created or f"2026-05-{rng.randint(1, 28):02d} {rng.randint(8, 17):02d}:{rng.choice(['00', '30'])}"
        s["tickets"].rows.append([tid, customer, subject, status, rng.choice(PRIORITIES[:3]),
                                  rng.choice(agents) if assignee == "random" else assignee, created, None])
        if rng.random() < 0.6:
            s["comments"].rows.append([len(s["comments"].rows) + 1, tid, "customer", f"Any news on: {subject.lower()}?"])
        return tid

    @staticmethod
    def _team(subject: str) -> str:
        return next(t for t, subjects in SUBJECTS.items() if subject in subjects)

    # -- scenarios (None: not possible on this store) --------------------------------------------
    def _close(self, rng: random.Random, s: Store):
        live = [t for t in s["tickets"].rows if t[3] in ("open", "pending")]
        if not live:
            return None
        t = rng.choice(live)
        text = (f"Ticket {t[0]} (\"{t[2]}\"): the customer just confirmed that the fix works. Please close the "
                "ticket; nothing else needs to change.")
        oracle = [call("get_ticket", ticket_id=t[0]), call("set_status", ticket_id=t[0], status="closed")]
        return Scenario(text, oracle, [after(s["tickets"], t[0], status="closed")], {"tickets": [t[0]]})

    def _triage(self, rng: random.Random, s: Store):
        customers = s["customers"]
        companies = [c for c in COMPANIES if [r[2] for r in customers.rows].count(c) == 1]
        if not companies:
            return None
        company = rng.choice(companies)
        cid = next(r[0] for r in customers.rows if r[2] == company)
        team = rng.choice(sorted(SUBJECTS))
        subject = rng.choice(SUBJECTS[team])
        if any(t[1] == cid and t[2] == subject for t in s["tickets"].rows):
            return None
        tid = self._ticket(s, rng, cid, "open", subject, assignee=None)
        self._ticket(s, rng, cid, "open", rng.choice([x for x in SUBJECTS[team] if x != subject]))
        load = {a[0]: sum(t[5] == a[0] and t[3] in ("open", "pending") for t in s["tickets"].rows)
                for a in s["agents"].rows if a[2] == team}
        ranked = sorted(load.items(), key=lambda kv: (kv[1], kv[0]))
        if ranked[0][1] == ranked[1][1]:
            return None  # "the agent with the fewest" must be one agent
        agent = ranked[0][0]
        text = (f"{company} called: their open ticket about \"{subject.lower()}\" is hurting their business. Please "
                f"make it urgent and hand it to whoever on the {team} team has the fewest open tickets right now. "
                "Don't touch their other tickets.")
        oracle = [call("search_customers", text=company), call("list_tickets", customer_id=cid, status="open"),
                  call("list_agents", team=team), call("set_priority", ticket_id=tid, priority="urgent"),
                  call("assign_ticket", ticket_id=tid, agent_id=agent)]
        return Scenario(text, oracle, [after(s["tickets"], tid, priority="urgent", assignee_id=agent)],
                        {"tickets": [tid]})

    def _merge(self, rng: random.Random, s: Store):
        customers = s["customers"]
        target, twin = customers.namesake(rng, company=COMPANIES)
        name, company = customers.by_key()[target][1], customers.by_key()[target][2]
        subject = rng.choice(SUBJECTS[rng.choice(sorted(SUBJECTS))])
        if any(t[1] == target and t[2] == subject for t in s["tickets"].rows):
            return None
        agents = [a[0] for a in s["agents"].rows if a[2] == self._team(subject)]
        first_agent, second_agent = rng.sample(agents, 2)
        day = rng.randint(1, 20)
        older = self._ticket(s, rng, target, "open", subject, first_agent, f"2026-05-{day:02d} 09:30")
        newer = self._ticket(s, rng, target, "open", subject, second_agent, f"2026-05-{day + rng.randint(1, 5):02d} 14:00")
        self._ticket(s, rng, twin, "open", subject)  # the namesake has a ticket on the same topic
        text = (f"{name} from {company} opened the same issue twice (\"{subject}\"). Please merge the newer ticket "
                "into the older one, have the agent who is handling the newer ticket take over the older one, and "
                "leave a note on the older ticket telling the customer we're working on it. Nothing else should change.")
        oracle = [call("search_customers", text=name), call("list_tickets", customer_id=target),
                  call("get_ticket", ticket_id=newer), call("merge_tickets", source_id=newer, target_id=older),
                  call("assign_ticket", ticket_id=older, agent_id=second_agent),
                  call("add_comment", ticket_id=older, body="We're working on this issue and will update you here soon.")]
        want = [after(s["tickets"], newer, status="merged", merged_into=older),
                after(s["tickets"], older, assignee_id=second_agent)]
        return Scenario(text, oracle, want, {"tickets": [older, newer]},
                        added=[["comments", {"ticket_id": older, "author": "support"}]])

    # -- what each level offers: the store's size (its knobs), the scenario, the tools and their helpers
    domain, library, helpers = "a support help desk", LIBRARY, DOMAIN_HELPERS
    sizes = {1: {"customers": 6, "agents": 6}, 2: {"customers": 10, "agents": 9}, 3: {"customers": 14, "agents": 12}}
    scenarios = ("_close", "_triage", "_merge")
