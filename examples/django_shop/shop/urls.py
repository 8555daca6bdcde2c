from __future__ import annotations

from django.urls import path

from shop import views

urlpatterns = [
    path("orders/", views.place_order, name="place_order"),
    path("orders/<str:run_id>/", views.order_status, name="order_status"),
    path("orders/<str:run_id>/shipped/", views.mark_shipped, name="mark_shipped"),
]
