"""The schedules app: cron schedules in a time zone that start workflows."""
